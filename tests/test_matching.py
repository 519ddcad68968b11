"""Hungarian matching against brute-force enumeration, and classifier matching properties."""

from __future__ import annotations

import itertools
import os

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from hybridfl.matching import (
    ClientClassifier,
    MatchingConfig,
    ServerClassifier,
    assign,
    euclidean_cost,
    match_classifiers,
    pfnm_cost,
    uncovered_share,
)


def brute_force_min(cost: np.ndarray) -> float:
    J, K = cost.shape
    return min(sum(cost[j, cols[j]] for j in range(J)) for cols in itertools.permutations(range(K), J))


@settings(max_examples=60, deadline=None)
@given(J=st.integers(1, 4), extra=st.integers(0, 3), seed=st.integers(0, 10_000))
def test_assign_is_optimal_against_brute_force(J, extra, seed):
    rng = np.random.default_rng(seed)
    cost = rng.normal(size=(J, J + extra))
    cols = assign(cost)
    assert len(set(cols.tolist())) == J  # distinct columns
    assert cost[np.arange(J), cols].sum() == __import__("pytest").approx(brute_force_min(cost))


@settings(max_examples=40, deadline=None)
@given(J=st.integers(1, 4), L=st.integers(0, 4), D=st.integers(1, 5), seed=st.integers(0, 10_000))
def test_pfnm_cost_assignment_is_optimal_against_brute_force(J, L, D, seed):
    rng = np.random.default_rng(seed)
    V = rng.normal(size=(J, D))
    prec = (rng.random(D) < 0.7).astype(float)
    nat = rng.normal(size=(L, D))
    sprec = 1.0 + rng.integers(0, 3, size=(L, D)).astype(float)
    counts = rng.integers(1, 4, size=L)
    cost = pfnm_cost(V, prec, nat, sprec, counts, n_clients=5, max_new=J)
    assert cost.shape == (J, L + J)
    cols = assign(cost)
    assert np.isclose(cost[np.arange(J), cols].sum(), brute_force_min(cost))


def test_pfnm_cost_ignores_coordinates_with_zero_precision():
    rng = np.random.default_rng(0)
    V = rng.normal(size=(3, 6))
    prec = np.array([1, 1, 1, 0, 0, 0], float)
    nat, sprec, counts = rng.normal(size=(4, 6)), 2 + rng.random((4, 6)), np.array([1, 2, 1, 3])
    a = pfnm_cost(V, prec, nat, sprec, counts, 4)
    V2 = V.copy()
    V2[:, 3:] = rng.normal(size=(3, 3)) * 100  # garbage on the missing columns
    b = pfnm_cost(V2, prec, nat, sprec, counts, 4)
    assert np.allclose(a, b)


def test_euclidean_cost_is_squared_distance_on_held_columns():
    V = np.array([[1.0, 2.0, 9.0]])
    mask = np.array([1.0, 1.0, 0.0])
    U = np.array([[0.0, 0.0, 0.0], [1.0, 2.0, -5.0], [3.0, 7.0, 0.0]])
    c = euclidean_cost(V, mask, U, new_penalty=7.0, max_new=1)
    assert np.allclose(c, [[5.0, 0.0, 29.0, 7.0]])
    # a server neuron known only on the first coordinate: distance there, scaled to 2 coordinates
    S = np.array([[1, 1, 1], [1, 1, 1], [1, 0, 0]])
    c = euclidean_cost(V, mask, U, new_penalty=7.0, server_mask=S, max_new=1)
    assert np.allclose(c, [[5.0, 0.0, 2 * 4.0, 7.0]])


def _server(L, D0, C, rng):
    return ServerClassifier(rng.normal(size=(L, D0)), rng.normal(size=L), rng.normal(size=(C, L)), rng.normal(size=C))


def _client_from(server, rows, cols, noise, rng, weight=1.0):
    return ClientClassifier(
        W1=server.W1[np.ix_(rows, cols)] + noise * rng.normal(size=(len(rows), len(cols))),
        b1=server.b1[rows] + noise * rng.normal(size=len(rows)),
        W2=server.W2[:, rows] + noise * rng.normal(size=(server.W2.shape[0], len(rows))),
        b2=server.b2 + noise * rng.normal(size=server.b2.shape),
        columns=np.asarray(cols),
        weight=weight,
    )


@settings(max_examples=int(os.environ.get("HYBRIDFL_EXAMPLES", 25)), deadline=None)
@given(seed=st.integers(0, 10_000), cost=st.sampled_from(["pfnm", "euclidean"]))
def test_matching_recovers_a_hidden_permutation(seed, cost):
    """Clients hold permuted, noisy copies of a server's neurons over different input columns;
    matching (with no previous assignment) finds which server neuron each client neuron is."""
    rng = np.random.default_rng(seed)
    L, D0, C = 8, 12, 3
    truth = _server(L, D0, C, rng)
    truth.W1 *= 3.0
    clients, perms = [], []
    for m, cols in enumerate([np.arange(0, 8), np.arange(4, 12), np.r_[0:4, 8:12]]):
        perm = rng.permutation(L)
        perms.append(perm)
        clients.append(_client_from(truth, perm, cols, 0.01, rng))
    res = match_classifiers(clients, truth, MatchingConfig(cost=cost, sweeps=3, sigma=0.1, sigma0=10.0), rng)
    assert res.server.width == L
    # neurons that were one neuron in the truth end up as one neuron in the server
    for j in range(L):
        targets = {int(res.assignments[m][np.flatnonzero(perms[m] == j)[0]]) for m in range(3)}
        assert len(targets) == 1
    # and the averaged server reproduces the truth (up to the permutation)
    for m in range(3):
        inv = res.assignments[m][np.argsort(perms[m])]
        assert np.allclose(res.server.W1[inv][:, clients[m].columns], truth.W1[:, clients[m].columns], atol=0.05)


@pytest.mark.parametrize("uncovered", ["zero", "previous"])
def test_closed_form_average_per_covered_entry(uncovered):
    """With known assignments and no sweeps, each server entry is the p_m-weighted mean over the
    clients covering it; an uncovered entry is 0 (HyFEM Appendix A's zero padding, the default) or
    keeps its previous value (``uncovered="previous"``) (brute force check)."""
    rng = np.random.default_rng(1)
    L, D0, C = 4, 6, 2
    prev = _server(L, D0, C, rng)
    a = ClientClassifier(
        rng.normal(size=(2, 3)),
        rng.normal(size=2),
        rng.normal(size=(C, 2)),
        rng.normal(size=C),
        columns=np.array([0, 1, 2]),
        weight=1.0,
        assignment=np.array([0, 1]),
    )
    b = ClientClassifier(
        rng.normal(size=(2, 3)),
        rng.normal(size=2),
        rng.normal(size=(C, 2)),
        rng.normal(size=C),
        columns=np.array([2, 3, 4]),
        weight=3.0,
        assignment=np.array([1, 2]),
    )
    res = match_classifiers([a, b], prev, MatchingConfig(sweeps=0, uncovered=uncovered), rng)
    S = res.server
    assert S.width == 3  # neuron 3 was matched by nobody and is dropped
    assert np.allclose(S.W1[0, :3], a.W1[0])
    if uncovered == "previous":
        assert np.allclose(S.W1[0, 3:], prev.W1[0, 3:])  # uncovered: previous value
        assert np.allclose(S.W1[1, 5], prev.W1[1, 5])
    else:
        assert np.all(S.W1[0, 3:] == 0) and S.W1[1, 5] == 0 and S.W1[2, [0, 1, 5]].tolist() == [0, 0, 0]
    assert res.stats["uncovered_share"] == pytest.approx((3 + 1 + 3) / 18)
    views = [(res.assignments[0], a.columns), (res.assignments[1], b.columns)]
    assert uncovered_share(S.width, D0, views) == pytest.approx((3 + 1 + 3) / 18)
    assert np.allclose(S.W1[1, 2], (1 * a.W1[1, 2] + 3 * b.W1[0, 0]) / 4)
    assert np.allclose(S.W1[1, :2], a.W1[1, :2]) and np.allclose(S.W1[1, 3:5], b.W1[0, 1:])
    assert np.allclose(S.b1[1], (a.b1[1] + 3 * b.b1[0]) / 4)
    assert np.allclose(S.W2[:, 2], b.W2[:, 1])
    assert np.allclose(S.b2, (a.b2 + 3 * b.b2) / 4)


def test_width_cap_is_respected_and_views_have_client_shape():
    rng = np.random.default_rng(2)
    prev = _server(4, 6, 3, rng)
    clients = [
        ClientClassifier(
            5 * rng.normal(size=(4, 3)),
            rng.normal(size=4),
            rng.normal(size=(3, 4)),
            rng.normal(size=3),
            columns=np.array(cols),
            weight=1.0,
        )
        for cols in ([0, 1, 2], [3, 4, 5], [0, 2, 4])
    ]
    cfg = MatchingConfig(cost="euclidean", sweeps=2, new_penalty=1e-6, max_width=6)
    res = match_classifiers(clients, prev, cfg, rng)
    assert res.server.width <= 6
    for c, a in zip(clients, res.assignments):
        assert len(set(a.tolist())) == c.width
        view = res.server.client_view(a, c.columns)
        assert view["fc1.weight"].shape == c.W1.shape and view["fc2.weight"].shape == c.W2.shape


def test_reserved_neurons_of_absent_clients_survive_and_remap():
    """A client that did not answer keeps its neurons: they are not dropped, keep their values,
    and `index` maps its old assignment to the new positions."""
    rng = np.random.default_rng(3)
    prev = _server(6, 6, 2, rng)
    present = ClientClassifier(
        rng.normal(size=(2, 3)),
        rng.normal(size=2),
        rng.normal(size=(2, 2)),
        rng.normal(size=2),
        columns=np.array([0, 1, 2]),
        weight=1.0,
        assignment=np.array([0, 1]),
    )
    absent = np.array([4, 5])
    res = match_classifiers([present], prev, MatchingConfig(sweeps=2), rng, reserved=[absent])
    new = res.index[absent]
    assert (new >= 0).all() and res.server.width == 4  # neurons 2 and 3 are dropped, 4 and 5 kept
    assert np.allclose(res.server.W1[new], prev.W1[absent])  # nobody updated them
    assert (res.index[[2, 3]] == -1).all()


@pytest.mark.parametrize("cost", ["pfnm", "euclidean"])
def test_width_cap_holds_when_absent_clients_fill_it(cost):
    """Partial participation with ``max_width``: the absent clients' reserved neurons already fill
    the cap and a new client (no previous assignment) must place all its neurons. It shares
    reserved ones instead of growing the server past the cap (this raised 'server width exceeds
    max_width' with fraction_fit < 1, found by python -m benchmarks.simulation scale)."""
    rng = np.random.default_rng(4)
    prev = _server(4, 6, 2, rng)
    newcomer = ClientClassifier(
        rng.normal(size=(3, 3)),
        rng.normal(size=3),
        rng.normal(size=(2, 3)),
        rng.normal(size=2),
        columns=np.array([0, 1, 2]),
        weight=1.0,
    )
    cfg = MatchingConfig(cost=cost, sweeps=2, max_width=4)
    res = match_classifiers([newcomer], prev, cfg, rng, reserved=[np.array([0, 1]), np.array([2, 3])])
    assert res.server.width == 4
    a = res.assignments[0]
    assert len(set(a.tolist())) == 3 and a.max() < 4


def _agreement(a: ServerClassifier, b: ServerClassifier, x: np.ndarray) -> float:
    """Share of inputs ``x`` on which two classifiers predict the same class."""

    def pred(s):
        return (np.maximum(x @ s.W1.T + s.b1, 0) @ s.W2.T + s.b2).argmax(1)

    return float(np.mean(pred(a) == pred(b)))


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_matching_opens_neurons_when_clients_do_not_align_and_beats_index_averaging(seed):
    """Issue 16 "matching that matters": three clients hold *different* subsets of a true
    classifier's 12 neurons (8 each, in their own order) over different input columns. PFNM
    matching (no previous assignments) widens the server beyond the client width to the 12 true
    neurons and reproduces the true classifier; plain index-wise averaging (``cost="index"``)
    stays at 8 neurons and mixes unrelated ones."""
    rng = np.random.default_rng(seed)
    L, D0, C = 12, 12, 4
    truth = _server(L, D0, C, rng)
    truth.W1 *= 3.0
    subsets = [np.arange(0, 8), np.arange(4, 12), np.r_[0:4, 8:12]]
    columns = [np.arange(0, 8), np.arange(4, 12), np.r_[0:4, 8:12]]
    clients = []
    for rows, cols in zip(subsets, columns):
        c = _client_from(truth, rng.permutation(rows), cols, 0.01, rng)
        c.b2 = truth.b2.copy()
        clients.append(c)
    # every true neuron is held by two clients whose columns together cover all D0 columns
    prev = _server(8, D0, C, rng)
    pf = match_classifiers(clients, prev, MatchingConfig(cost="pfnm", sweeps=3, sigma=0.1, sigma0=10.0), rng)
    ix = match_classifiers(clients, prev, MatchingConfig(cost="index"), rng)
    assert pf.server.width == L > clients[0].width  # the matching opened new neurons
    assert pf.stats["new_neurons"] == L
    assert ix.server.width == clients[0].width
    x = rng.normal(size=(4000, D0))
    agree_pf = _agreement(pf.server, truth, x)
    agree_ix = _agreement(ix.server, truth, x)
    print(f"agreement with the truth: pfnm {agree_pf:.3f}, index-wise {agree_ix:.3f}")
    assert agree_pf > 0.95
    assert agree_pf > agree_ix + 0.2


def test_matching_options_are_checked_and_reach_the_matcher():
    """``uncovered`` and ``cost="index"`` are validated and passed from HyFEM's config; the defaults
    are the paper's (PFNM cost, zero padding of uncovered entries)."""
    from pydantic import ValidationError

    from hybridfl.algorithms.hyfem import HyFEMConfig

    with pytest.raises(ValueError, match="uncovered"):
        MatchingConfig(uncovered="random")
    with pytest.raises(ValidationError):
        HyFEMConfig(matching={"uncovered": "random"})
    assert (MatchingConfig().cost, MatchingConfig().uncovered) == ("pfnm", "zero")
    mc = HyFEMConfig(matching={"uncovered": "previous", "cost": "index"}).matching.to_config()
    assert (mc.cost, mc.uncovered) == ("index", "previous")
