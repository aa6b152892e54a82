"""Stand-in for `sgl_kernel` (SGLang's compiled CUDA/CPU kernel library) so SGLang imports on a CPU-only box.

Why: sglang 0.5.23 does `import sgl_kernel` on its CPU engine path, but the real wheel (`sglang-kernel`) is a
CUDA build that needs torch 2.14.1 and the GPU driver's libcuda, which .venv-sglang (CPU torch 2.13.0) does
not have. On the path rlboost uses (SGLANG_USE_CPU_ENGINE=1, torch_native attention, pytorch sampling) no
kernel of it is called. So this package is importable and deliberately empty: `from sgl_kernel import x`
and `import sgl_kernel.x` raise ImportError, which lets SGLang take its own pure-torch fallbacks (it guards
those imports), and it registers no `torch.ops.sgl_kernel` operators, so SGLang's AMX check
(`hasattr(torch.ops.sgl_kernel, "convert_weight_packed")`) is False and it uses plain torch.

Only .venv-sglang sees this package (scripts/setup_sglang_env.sh adds tests/sglang_stubs to its path with a
.pth file); the GPU image (docker/rollout-worker-sglang.Dockerfile) has the real kernel library.
"""

from collections.abc import Callable
from typing import Any, NoReturn

__version__ = "0.0.0+rlboost.cpu.standin"
STANDIN = True

# Names sglang imports from sgl_kernel without a fallback on the CPU import path (found by importing
# sglang.srt.entrypoints.engine and starting an Engine in .venv-sglang). Each raises if ever called.
_UNGUARDED = (
    "copy_all_layer_kv_cache_cpu",
    "assign_req_to_token_pool_cpu",
    "build_tree_kernel_efficient_cpu",
    "verify_tree_greedy_cpu",
    "assign_draft_cache_locs_contiguous_cpu",
    "assign_extend_cache_locs_cpu",
    "fill_accept_out_cache_loc_cpu",
    "fill_bonus_tokens_cpu",
)


def _missing(name: str) -> Callable[..., NoReturn]:
    def kernel(*_args: Any, **_kwargs: Any) -> NoReturn:
        raise NotImplementedError(
            f"sgl_kernel.{name} is not available: this is the CPU stand-in (tests/sglang_stubs/sgl_kernel). "
            "Use attention_backend='torch_native' and sampling_backend='pytorch' on CPU, or the GPU image."
        )

    kernel.__name__ = kernel.__qualname__ = name
    return kernel


globals().update({name: _missing(name) for name in _UNGUARDED})
