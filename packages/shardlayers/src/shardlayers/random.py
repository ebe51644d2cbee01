"""RNG state tracker (Megatron-style) for tensor-parallel regions.

Parameters of the parallel layers are initialised from the full-size tensor drawn from the default
CPU generator and then sliced, so a sharded model equals the slices of the single-process model
built with the same seed. Dropout on *split* activations must however differ between tensor-parallel
ranks (each holds different features): run it inside ``get_rng_tracker().fork()``, whose generator
is seeded with ``seed + 2718 + tensor_parallel_rank`` by :func:`manual_seed`. Dropout on replicated
activations runs outside, on the default generator, identical on every rank of the group.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator

import torch

_MODEL_PARALLEL_RNG = "model-parallel-rng"


class RNGStatesTracker:
    """Named RNG states that can be swapped in with :meth:`fork`."""

    def __init__(self) -> None:
        self.states: dict[str, torch.Tensor] = {}
        self.seeds: set[int] = set()

    def reset(self) -> None:
        """Forget every state."""
        self.states = {}
        self.seeds = set()

    def add(self, name: str, seed: int) -> None:
        """Register state ``name`` seeded with ``seed``.

        Parameters
        ----------
        name : str
            The state's name (used by :meth:`fork`).
        seed : int
            The seed of a fresh CPU generator whose state is kept.

        Raises
        ------
        ValueError
            If the name or the seed is already registered.
        """
        if seed in self.seeds:
            raise ValueError(f"seed {seed} already exists")
        if name in self.states:
            raise ValueError(f"rng state {name!r} already exists")
        self.seeds.add(seed)
        gen = torch.Generator()
        gen.manual_seed(seed)
        self.states[name] = gen.get_state()

    @contextlib.contextmanager
    def fork(self, name: str = _MODEL_PARALLEL_RNG) -> Iterator[None]:
        """Run the body with the default CPU generator set to state ``name``, then restore it.

        Parameters
        ----------
        name : str, default "model-parallel-rng"
            A state registered with :meth:`add`; it keeps where the body left it.

        Yields
        ------
        None
            Control, inside the forked state.

        Raises
        ------
        KeyError
            If ``name`` was never added.
        """
        if name not in self.states:
            raise KeyError(f"rng state {name!r} is not added (call shardlayers.random.manual_seed first)")
        saved = torch.get_rng_state()
        torch.set_rng_state(self.states[name])
        try:
            yield
        finally:
            self.states[name] = torch.get_rng_state()
            torch.set_rng_state(saved)


_TRACKER = RNGStatesTracker()


def get_rng_tracker() -> RNGStatesTracker:
    """Return the process-wide tracker.

    Returns
    -------
    RNGStatesTracker
        The tracker :func:`manual_seed` seeds.
    """
    return _TRACKER


def manual_seed(seed: int) -> None:
    """Seed the default generator and the tracker's model-parallel state.

    The default generator gets ``seed`` (the same on every rank), the tracker's model-parallel
    state ``seed + 2718 + tensor_parallel_rank``.

    Parameters
    ----------
    seed : int
        The base seed.

    Raises
    ------
    RuntimeError
        If the process groups are not initialised.
    """
    from .distributed import get_rank

    torch.manual_seed(seed)
    _TRACKER.reset()
    _TRACKER.add(_MODEL_PARALLEL_RNG, seed + 2718 + get_rank())
