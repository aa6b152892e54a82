{{- define "rlboost.fullname" -}}
{{- printf "%s" .Release.Name | trunc 63 | trimSuffix "-" -}}
{{- end -}}

{{- define "rlboost.labels" -}}
app.kubernetes.io/name: rlboost
app.kubernetes.io/instance: {{ .Release.Name }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
helm.sh/chart: {{ printf "%s-%s" .Chart.Name .Chart.Version }}
{{- end -}}

{{- define "rlboost.operatorSelector" -}}
app.kubernetes.io/name: rlboost
app.kubernetes.io/instance: {{ .Release.Name }}
app.kubernetes.io/component: operator
{{- end -}}


{{- /* images.pullSecrets' names as a JSON list (the operator gives them to every job pod). */ -}}
{{- define "rlboost.pullSecretNames" -}}
{{- $names := list -}}
{{- range .Values.images.pullSecrets -}}
{{- $names = append $names (kindIs "string" . | ternary . .name) -}}
{{- end -}}
{{- toJson $names -}}
{{- end -}}
