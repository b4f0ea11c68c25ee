"""The routing plan against mok.reference.moe_plan: exact equality on ragged routings."""
import pytest
import torch

import mok
from conftest import DEVICES
from mok import reference
from shapes import make_routing


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("tile", [1, 8, 128])
@pytest.mark.parametrize("T,K,E,kind", [
    (0, 2, 4, "random"), (1, 1, 4, "random"), (1, 4, 4, "random"), (37, 2, 6, "empty_expert"),
    (53, 3, 5, "one_expert"), (300, 8, 17, "zipf"), (2000, 4, 64, "random"),
])
def test_plan_matches_reference(device, tile, T, K, E, kind):
    idx = make_routing(T, K, E, kind)
    plan = mok.functional.moe_plan(idx.to(device), E, tile=tile)
    ref = reference.moe_plan(idx, E, tile)
    for name, got, want in zip(plan._fields, plan, ref):
        assert torch.equal(got.cpu(), want), name
    assert plan.src_of_row.shape[0] == reference.plan_capacity(T, K, E, tile)


@pytest.mark.parametrize("device", DEVICES)
def test_plan_skips_and_counts_invalid_ids(device):
    idx = torch.tensor([[0, 5], [-1, 1], [2, 99]], dtype=torch.int64)
    plan = mok.functional.moe_plan(idx.to(device), 4, tile=4, skip_invalid=True)
    ref = reference.moe_plan(idx.clamp(-1, 4), 4, 4, skip_invalid=True)
    assert int(plan.num_skipped.cpu()) == 3
    for name, got, want in zip(plan._fields, plan, ref):
        assert torch.equal(got.cpu(), want), name


def test_plan_rejects_invalid_ids_on_cpu():
    with pytest.raises(ValueError, match="topk_idx"):
        mok.functional.moe_plan(torch.tensor([[0, 4]]), 4)


def test_capacity_bound_holds_for_worst_case():
    # Every expert gets one pair: the most padding a routing can need.
    for T, K, E, tile in [(5, 1, 8, 128), (64, 2, 128, 128), (3, 3, 2, 16)]:
        idx = torch.arange(T * K).remainder(E).view(T, K)
        plan = mok.functional.moe_plan(idx, E, tile=tile)
        assert int(plan.offsets[-1]) <= plan.src_of_row.shape[0]
