"""The tuner's search: which served shapes to try, in what order, and which one wins.

Pure: no server, no clock of its own. `search` gets a `measure(shape) -> Measurement` and a clock, so the
tests drive it over a synthetic cost model whose best shape is known, and `tune` drives it over a real
tritonserver. Coordinate descent from the hand-written config: one axis at a time, step to the neighbouring
value while that beats the incumbent, then the next axis; passes repeat until one finds nothing or the budget
is spent. A shape replaces the incumbent only when it meets the latency bound and beats it by more than the
measurement noise (the spread of the baseline measured twice, at least `min_gain`) in two runs, so a model is
never served worse than it was.

The axes are pluggable: a batching model's shape (`Shape`, the axes below) by default, a generation engine's
(build_engines/tune_generation.py) with its own axes and validity; measurements say how fast in one figure,
`rows_per_s` (completion tokens/s for a generation engine).
"""

from __future__ import annotations

from collections.abc import Callable, Hashable, Iterator, Sequence
from dataclasses import dataclass, field, replace
from typing import Any, Generic, Protocol, TypeVar

from build_engines.errors import BuildEnginesError

DELAYS_US = (0, 100, 500, 1000, 2000, 5000, 10000)


class Served(Hashable, Protocol):
    def describe(self) -> str: ...


S = TypeVar("S", bound=Served)


@dataclass(frozen=True)
class Shape:
    """The served fields the tuner changes; None where the model's config has no such field."""

    max_batch_size: int
    delay_us: int | None  # dynamic_batching.max_queue_delay_microseconds; None: no dynamic batching
    preferred: tuple[int, ...]  # dynamic_batching.preferred_batch_size
    instances: int
    threads: int | None  # the INTRA_OP_THREADS parameter; None: the model has none

    @property
    def call_rows(self) -> int:
        """Rows the control plane packs per call for this shape: its largest preferred batch size, else the
        max (controlplane/fleet/models.CatalogueModel.rows_per_call, which `manage.py tune_model` sets)."""
        return max(self.preferred, default=self.max_batch_size)

    def describe(self) -> str:
        delay = "off" if self.delay_us is None else f"{self.delay_us}us"
        preferred = ",".join(map(str, self.preferred)) or "-"
        threads = "-" if self.threads is None else str(self.threads)
        return (
            f"batch={self.max_batch_size} delay={delay} preferred={preferred} inst={self.instances} threads={threads}"
        )


@dataclass(frozen=True)
class Measurement:
    rows_per_s: float  # the throughput: rows/s, or completion tokens/s for a generation engine
    p95_ms: float
    error: str = ""  # the load or a call failed: such a shape never wins
    load_s: float = 0.0

    @property
    def ok(self) -> bool:
        return not self.error


@dataclass(frozen=True)
class Limits:
    cores: int
    max_batch_size: int  # the largest max_batch_size tried
    max_instances: int
    max_p95_ms: float | None = None  # None: twice the baseline's p95
    min_gain: float = 0.03  # the least relative gain that counts, however quiet the baseline was


class SearchLimits(Protocol):
    """What `search` itself reads of a limits object; the axes and `valid` read the rest."""

    @property
    def cores(self) -> int: ...
    @property
    def max_p95_ms(self) -> float | None: ...
    @property
    def min_gain(self) -> float: ...


@dataclass(frozen=True)
class Trial(Generic[S]):
    index: int
    shape: S
    measurement: Measurement
    note: str = ""


@dataclass
class SearchResult(Generic[S]):
    baseline: Trial[S]  # the baseline's two measurements averaged
    trials: list[Trial[S]]
    noise: float
    bound_ms: float
    chosen: Trial[S]
    stopped_by_budget: bool = False
    cores: int = 0
    notes: list[str] = field(default_factory=list)

    @property
    def gain(self) -> float:
        base = self.baseline.measurement.rows_per_s
        return self.chosen.measurement.rows_per_s / base - 1.0 if base > 0 else 0.0


class SearchError(BuildEnginesError):
    """The baseline itself could not be measured: there is nothing to compare a candidate with (exit 1)."""


def _powers_of_two(top: int) -> list[int]:
    values, value = [], 1
    while value <= top:
        values.append(value)
        value *= 2
    return values


def _step(values: list[int], current: int) -> list[int]:
    """The neighbours of ``current`` in the sorted ``values`` (it need not be one of them)."""
    below = [v for v in values if v < current]
    above = [v for v in values if v > current]
    return ([below[-1]] if below else []) + ([above[0]] if above else [])


def valid(shape: Shape, limits: Limits) -> bool:
    threads = shape.threads or 1
    return (
        1 <= shape.max_batch_size <= max(limits.max_batch_size, 1)
        and 1 <= shape.instances <= limits.max_instances
        and shape.instances * threads <= max(limits.cores, 1)
        and all(1 <= p <= shape.max_batch_size for p in shape.preferred)
    )


def _batch_moves(shape: Shape, limits: Limits, baseline: Shape) -> list[Shape]:
    values = sorted(set(_powers_of_two(limits.max_batch_size)) | {baseline.max_batch_size})
    moves = []
    for size in _step(values, shape.max_batch_size):
        # Preferred sizes follow the batch size they were relative to: [max] stays [max].
        preferred = tuple(sorted({size if p == shape.max_batch_size else p for p in shape.preferred if p <= size}))
        moves.append(replace(shape, max_batch_size=size, preferred=preferred))
    return moves


def _delay_moves(shape: Shape, limits: Limits, baseline: Shape) -> list[Shape]:
    if shape.delay_us is None:  # no dynamic batching yet: turning it on is the one move
        return [replace(shape, delay_us=baseline.delay_us or 0)]
    values = sorted(set(DELAYS_US) | ({baseline.delay_us} if baseline.delay_us is not None else set()))
    return [replace(shape, delay_us=delay) for delay in _step(values, shape.delay_us)]


def _preferred_moves(shape: Shape, limits: Limits, baseline: Shape) -> list[Shape]:
    if shape.delay_us is None:
        return []
    top = shape.max_batch_size
    options = {(), (top,), tuple(sorted({max(1, top // 2), top})), tuple(p for p in baseline.preferred if p <= top)}
    return [replace(shape, preferred=option) for option in sorted(options) if option != shape.preferred]


def _layout_moves(shape: Shape, limits: Limits, baseline: Shape) -> list[Shape]:
    """Instances and threads move together: on a full machine, one more instance means fewer threads each."""
    instances = sorted(set(_powers_of_two(limits.max_instances)) | {baseline.instances, limits.max_instances})
    if shape.threads is None:
        return [replace(shape, instances=n) for n in _step(instances, shape.instances)]
    threads = sorted(set(_powers_of_two(limits.cores)) | {baseline.threads or 1, limits.cores})
    moves = []
    for n in [shape.instances, *_step(instances, shape.instances)]:
        for t in [shape.threads, *_step(threads, shape.threads)]:
            if (n, t) != (shape.instances, shape.threads):
                moves.append(replace(shape, instances=n, threads=t))
    return moves


# A move proposes the neighbours of the incumbent (shape, limits, baseline) along one axis.
Axis = Callable[[Any, Any, Any], list[Any]]

AXES: tuple[Callable[[Shape, Limits, Shape], list[Shape]], ...] = (
    _batch_moves,
    _layout_moves,
    _delay_moves,
    _preferred_moves,
)


def _mean(first: Measurement, second: Measurement) -> Measurement:
    if not second.ok:
        return first
    return Measurement(
        rows_per_s=(first.rows_per_s + second.rows_per_s) / 2,
        p95_ms=max(first.p95_ms, second.p95_ms),
        load_s=first.load_s,
    )


def search(
    baseline: S,
    measure: Callable[[S], Measurement],
    limits: SearchLimits,
    *,
    budget_s: float,
    clock: Callable[[], float],
    report: Callable[[Trial[S], int], None] = lambda trial, planned: None,
    axes: Sequence[Axis] = AXES,
    is_valid: Callable[[Any, Any], bool] = valid,
) -> SearchResult[S]:
    """Measure the baseline twice, then climb axis by axis until nothing wins or ``budget_s`` is spent.

    ``report(trial, planned)`` is called after each measurement; ``planned`` is how many trials the budget
    allows at the pace so far (a progress figure, not a promise). Every measured shape is ``is_valid``; the
    default axes and validity are a batching model's."""
    started = clock()
    trials: list[Trial[S]] = []

    def run(shape: S, note: str = "") -> Trial[S]:
        trial = Trial(len(trials) + 1, shape, measure(shape), note)
        trials.append(trial)
        elapsed = clock() - started
        pace = elapsed / len(trials) if elapsed > 0 else 0.0
        planned = max(len(trials), int(budget_s / pace)) if pace > 0 else len(trials)
        report(trial, planned)
        return trial

    first = run(baseline, "baseline")
    if not first.measurement.ok:
        raise SearchError(f"the current config does not serve: {first.measurement.error}")
    second = run(baseline, "baseline, repeated")
    spread = 0.0
    if second.measurement.ok:
        high = max(first.measurement.rows_per_s, second.measurement.rows_per_s)
        spread = abs(first.measurement.rows_per_s - second.measurement.rows_per_s) / high if high > 0 else 0.0
    noise = max(limits.min_gain, spread)
    base = Trial(first.index, baseline, _mean(first.measurement, second.measurement), "baseline")
    bound = limits.max_p95_ms if limits.max_p95_ms is not None else 2 * base.measurement.p95_ms

    def eligible(m: Measurement) -> bool:
        return m.ok and m.p95_ms <= bound

    def beats(m: Measurement, incumbent: Measurement) -> bool:
        if not eligible(m):
            return False
        return not eligible(incumbent) or m.rows_per_s > incumbent.rows_per_s * (1 + noise)

    incumbent = base
    seen = {baseline}
    stopped = False

    def candidates() -> Iterator[S]:
        for move in axes:
            yield from (s for s in move(incumbent.shape, limits, baseline) if s not in seen and is_valid(s, limits))

    def over_budget() -> bool:
        elapsed = clock() - started
        return elapsed + elapsed / len(trials) > budget_s

    def confirm(winner: Trial[S]) -> Trial[S] | None:
        """The winner measured again: it replaces the incumbent only if this run beats it too (then it stands
        at the mean of both), so a run that met a quiet moment of the host does not decide alone."""
        again = run(winner.shape, "repeated")
        if not beats(again.measurement, incumbent.measurement):
            return None
        return Trial(winner.index, winner.shape, _mean(winner.measurement, again.measurement), winner.note)

    improved = True
    while improved and not stopped:
        improved = False
        for move in axes:
            while not stopped:
                moves = [s for s in move(incumbent.shape, limits, baseline) if s not in seen and is_valid(s, limits)]
                winner: Trial[S] | None = None
                for shape in moves:
                    if over_budget():
                        stopped = True
                        break
                    seen.add(shape)
                    trial = run(shape)
                    if beats(trial.measurement, incumbent.measurement) and (
                        winner is None or trial.measurement.rows_per_s > winner.measurement.rows_per_s
                    ):
                        winner = trial
                if winner is None:
                    break
                confirmed = None if over_budget() else confirm(winner)
                if confirmed is None:  # a lucky run, or no time left to tell: the incumbent stays
                    stopped = stopped or over_budget()
                    break
                incumbent, improved = confirmed, True
    notes = []
    if stopped:
        untried = sum(1 for _ in candidates())
        notes.append(f"budget of {budget_s:g} s spent with {untried} neighbouring shape(s) untried")
    return SearchResult(
        baseline=base,
        trials=trials,
        noise=noise,
        bound_ms=bound,
        chosen=incumbent,
        stopped_by_budget=stopped,
        cores=limits.cores,
        notes=notes,
    )


def trial_reporter(echo: Callable[[str], None], unit: str = "rows/s") -> Callable[[Trial[Any], int], None]:
    """The search's progress line for each trial: its shape, figures in ``unit`` (or its failure) and note."""

    def report(trial: Trial[Any], planned: int) -> None:
        m = trial.measurement
        figures = f"{m.rows_per_s:.1f} {unit} p95 {m.p95_ms:.0f} ms" if m.ok else f"failed: {m.error}"
        note = f" ({trial.note})" if trial.note else ""
        echo(f"[{trial.index}/{planned}] {trial.shape.describe()}: {figures}{note}")

    return report


def render_table(result: SearchResult[Any], unit: str = "rows/s") -> str:
    """The sweep, one line a measurement, and the choice; ``unit`` is the throughput's (tokens/s: generation)."""
    width = max(24, *(len(trial.shape.describe()) for trial in result.trials))
    lines = [f"{'#':>3}  {'shape':<{width}} {unit:>9} {'p95 ms':>8}  note"]
    for trial in result.trials:
        m = trial.measurement
        figures = f"{m.rows_per_s:>9.1f} {m.p95_ms:>8.0f}" if m.ok else f"{'-':>9} {'-':>8}"
        note = trial.note or ("" if m.ok else m.error) or ("over the p95 bound" if m.p95_ms > result.bound_ms else "")
        lines.append(f"{trial.index:>3}  {trial.shape.describe():<{width}} {figures}  {note}")
    chosen = result.chosen
    verdict = (
        "the current config (nothing beat it)" if chosen.shape == result.baseline.shape else chosen.shape.describe()
    )
    lines.append(
        f"noise {result.noise:.1%}, p95 bound {result.bound_ms:.0f} ms; chosen: {verdict} "
        f"at {chosen.measurement.rows_per_s:.1f} {unit} ({result.gain:+.1%})"
    )
    lines.extend(result.notes)
    return "\n".join(lines)


def tune_line(name: str, result: SearchResult[Any], counted: str = "rows") -> str:
    """The one line for scripts; ``counted`` names what is counted per second (rows, tokens)."""
    return (
        f"TUNE model={name} baseline_{counted}_per_s={result.baseline.measurement.rows_per_s:.1f} "
        f"best_{counted}_per_s={result.chosen.measurement.rows_per_s:.1f} gain={result.gain:.3f} "
        f'chosen="{result.chosen.shape.describe()}"'
    )
