"""RolloutRequest.carried on the wire (rlboost.wire.rollout_proto): a carried group of an episodes step goes with its
environment task, and one without it is refused naming the field; the episodes carried now are in GetStatus."""

from __future__ import annotations

import pytest

from rlboost.wire.rollout_io import CarriedGroup, EpisodeSettings, RolloutRequest, SamplingParams
from rlboost.wire.rollout_proto import WireError, rollout_request_from_pb, rollout_request_to_pb


def _request(carried: CarriedGroup, episodes: EpisodeSettings | None) -> RolloutRequest:
    return RolloutRequest(1, 1, [], 2, SamplingParams(), target_groups=1, carried=[carried], episodes=episodes)


def test_an_episodes_carried_group_goes_with_its_task_and_needs_no_prompt_ids():
    group = CarriedGroup(0, 3, [], [1], '{"question": "q", "answer": "a"}')
    back = rollout_request_from_pb(rollout_request_to_pb(_request(group, EpisodeSettings(3, 64))))
    assert back.carried == [group]


def test_a_carried_group_without_what_starts_it_again_is_refused_naming_the_field():
    with pytest.raises(WireError, match=r"rollout.carried\[0\].task_json"):
        rollout_request_from_pb(rollout_request_to_pb(_request(CarriedGroup(0, 3, [7], [1]), EpisodeSettings(3, 64))))
    with pytest.raises(WireError, match=r"rollout.carried\[0\].prompt_ids"):
        rollout_request_from_pb(rollout_request_to_pb(_request(CarriedGroup(0, 3, [], [1], "{}"), None)))


def test_the_episodes_carried_now_go_through_get_status():
    from rlboost.wire.rollout_io import EpisodeCounts, ManagerStatus
    from rlboost.wire.rollout_proto import status_from_pb, status_to_pb

    status = ManagerStatus([], 0, 0, 0, 0, 0, episodes=EpisodeCounts(running=3, carried=2))
    assert status_from_pb(status_to_pb(status)).episodes == EpisodeCounts(running=3, carried=2)
