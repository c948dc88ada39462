"""`mst` counts its own tree's copies on shared links, and refuses options it does not know.

The graph `fork`: G reaches the locals A and B only through the switching site X, and G-X has a
single wavelength, so only one of the task's edges can cross G->X::

    G ==1 x 1000== X ---- A
                   |
                   +----- B
"""

from __future__ import annotations

import math
from typing import Any

import pytest

from orchestrator.errors import ConfigError
from orchestrator.scheduling import NetworkState, OverlayEdge, Schedule, get_scheduler
from orchestrator.scheduling.mst import MST, MST_WEIGHTS
from orchestrator.scheduling.tasks import Task
from topologies.model import NetworkModel

D = 1000.0  # demand, Mbit/s
TASK = Task(id=1, global_site="G", local_sites=("A", "B"), demand_mbps=D)


def fork(*, detour: bool = False, xa_wavelengths: int = 2) -> NetworkModel:
    """`fork` (module docstring), with 2 wavelengths on X-B and `xa_wavelengths` on X-A;
    `detour` adds A-Y-B, 300 km per link, Y switching only."""
    sites: list[dict[str, Any]] = [{"name": "G"}, {"name": "A"}, {"name": "B"}, {"name": "X", "has_compute": False}]
    links: list[dict[str, Any]] = [
        {"a": "G", "b": "X", "wavelengths": 1, "wavelength_mbps": D},
        {"a": "X", "b": "A", "wavelengths": xa_wavelengths, "wavelength_mbps": D},
        {"a": "X", "b": "B", "wavelengths": 2, "wavelength_mbps": D},
    ]
    if detour:
        sites.append({"name": "Y", "has_compute": False})
        links += [
            {"a": "A", "b": "Y", "wavelengths": 2, "wavelength_mbps": D, "length_km": 300},
            {"a": "Y", "b": "B", "wavelengths": 2, "wavelength_mbps": D, "length_km": 300},
        ]
    return NetworkModel.build("fork", sites, links)


def test_relays_through_a_local_when_its_own_copies_fill_the_shared_link() -> None:
    # Prepare: G-X-A and G-X-B would both cross G->X; G->A->B crosses it once.
    state = NetworkState(fork())

    # Execute
    s = get_scheduler("mst").schedule(state, TASK)

    # Assert
    assert not s.blocked, s.reason
    assert dict(s.broadcast_parent) == {"A": "G", "B": "A"}
    assert s.path("broadcast", "G", "A") == ("G", "X", "A")
    assert s.path("broadcast", "A", "B") == ("A", "X", "B")
    # The upload cannot take A-X-G: the broadcast's A->B holds A->X on wavelength 0, the only
    # one X->G has. B-X-G fits, and A joins through B (wavelength 1 on A-X-B).
    assert dict(s.upload_parent) == {"B": "G", "A": "B"}
    assert s.path("upload", "B", "G") == ("B", "X", "G")
    assert s.path("upload", "A", "B") == ("A", "X", "B")
    assert s.reservations[("G", "X")] == D and s.reservations[("X", "G")] == D
    assert s.aggregation_sites == frozenset({"G", "B"})
    state.admit(s)  # the state's own check agrees that it fits
    assert state.residual_mbps("G", "X") == 0.0


def test_still_blocks_when_no_lightpath_is_left_from_the_tree() -> None:
    # Prepare: background fills A->X, so once G-X-A holds G->X, nothing reaches B.
    state = NetworkState(fork())
    state.set_background({("A", "X"): 2 * D})

    # Execute
    s = get_scheduler("mst").schedule(state, TASK)

    # Assert
    assert s.blocked
    assert s.reason == "broadcast: no path with enough residual capacity from the tree to B"
    assert s.reservations == {} and s.edges == ()


def test_upload_counts_what_the_broadcast_took() -> None:
    # Prepare: one wavelength on X-A. The broadcast G->A->B takes A->X for A-X-B, which leaves
    # A no way out for its upload, although the network state has A->X all free.
    state = NetworkState(fork(xa_wavelengths=1))

    # Execute
    s = get_scheduler("mst").schedule(state, TASK)

    # Assert
    assert state.residual_mbps("A", "X") == D
    assert s.blocked
    assert s.reason == "upload: no path with enough residual capacity from the tree to A"


def test_takes_the_cheapest_lightpath_when_its_path_has_no_common_wavelength() -> None:
    # Prepare: another task holds wavelength 1 on A->X and wavelength 0 on X->B. Each link still
    # has 1000 Mbit/s free, so A-X-B looks feasible link by link, but no wavelength is free on
    # both (continuity); the detour A-Y-B has wavelength 0 free all along.
    state = NetworkState(fork(detour=True))
    other = Schedule(
        task_id=99, scheduler="hand", global_site="X", local_sites=("B",), demand_mbps=D,
        edges=(OverlayEdge("broadcast", "X", "B", ("X", "B"), 0), OverlayEdge("broadcast", "A", "X", ("A", "X"), 1)),
    )
    state.admit(other)
    assert state.residual_mbps("A", "X") == D and state.residual_mbps("X", "B") == D

    # Execute
    s = get_scheduler("mst").schedule(state, TASK)

    # Assert
    assert not s.blocked, s.reason
    assert dict(s.broadcast_parent) == {"A": "G", "B": "A"}
    assert s.path("broadcast", "A", "B") == ("A", "Y", "B")
    state.admit(s)


def test_an_ample_network_gives_the_same_trees_as_before() -> None:
    # Prepare: 8 wavelengths on G-X, so the task's copies never fill a link.
    model = NetworkModel.build(
        "fork8",
        [{"name": "G"}, {"name": "A"}, {"name": "B"}, {"name": "X", "has_compute": False}],
        [{"a": "G", "b": "X"}, {"a": "X", "b": "A"}, {"a": "X", "b": "B"}],
    )

    # Execute
    s = get_scheduler("mst").schedule(NetworkState(model), TASK)

    # Assert: the MST over the closure joins both locals to G (a tie with A->B goes to G).
    assert dict(s.broadcast_parent) == {"A": "G", "B": "G"}
    assert s.reservations[("G", "X")] == 2 * D


# -- options --------------------------------------------------------------------------------------


@pytest.mark.parametrize("weight", ["delay", "Aux", "", None, 1])
def test_unknown_weight_is_refused_naming_the_allowed_ones(weight: object) -> None:
    with pytest.raises(ValueError, match="use one of 'aux', 'hops'") as err:
        MST(weight=weight)  # type: ignore[arg-type]
    assert repr(weight) in str(err.value)


def test_get_scheduler_reports_a_bad_mst_weight_as_a_config_error() -> None:
    with pytest.raises(ConfigError, match="scheduler 'mst': option 'weight' must be one of 'aux', 'hops', got 'delay'"):
        get_scheduler("mst", weight="delay")


@pytest.mark.parametrize(
    ("option", "value", "allowed"),
    [
        ("latency_weight", 1.5, "0 <= latency_weight <= 1"),
        ("latency_weight", -0.1, "0 <= latency_weight <= 1"),
        ("latency_weight", math.nan, "0 <= latency_weight <= 1"),
        ("latency_weight", "0.5", "0 <= latency_weight <= 1"),
        ("latency_weight", True, "0 <= latency_weight <= 1"),
        ("load_weight", -1.0, "load_weight >= 0"),
        ("load_weight", math.inf, "load_weight >= 0"),
        ("load_weight", None, "load_weight >= 0"),
        ("reuse_discount", 0.0, "0 < reuse_discount <= 1"),
        ("reuse_discount", 1.5, "0 < reuse_discount <= 1"),
    ],
)
def test_bad_numeric_option_is_refused_with_its_range(option: str, value: object, allowed: str) -> None:
    with pytest.raises(ValueError, match=f"mst option {option} must be a number with {allowed}, got"):
        MST(**{option: value})  # type: ignore[arg-type]


def test_hops_refuses_options_it_would_ignore() -> None:
    with pytest.raises(ValueError, match="ignores latency_weight, load_weight and reuse_discount"):
        MST(weight="hops", load_weight=2.0)


@pytest.mark.parametrize("weight", MST_WEIGHTS)
def test_allowed_options_are_kept(weight: str) -> None:
    mst = MST(weight=weight)  # type: ignore[arg-type]
    tuned = MST(latency_weight=0, load_weight=3, reuse_discount=1)

    assert mst.weight == weight
    assert (tuned.lam, tuned.kappa, tuned.rho) == (0, 3, 1)
    assert MST_WEIGHTS == ("aux", "hops")
