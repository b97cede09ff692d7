"""A study's verdict as a markdown page (``verdict.md``), and the table of every study run
(``reproductions.md``)."""

from __future__ import annotations

from ..progress import duration
from ..records import ALPHA, Cell
from ..stats import interval
from ..summary import format_cell, format_number
from ..tallies import tally_lines
from .sweeps import SENSITIVITY, SweepResult
from .verdicts import ClaimResult, StudyResult


def study_lines(result: StudyResult) -> list[str]:
    """A study's verdict as markdown: the claims' figures, their test and verdict."""
    lines = [f"# {result.name}: {result.verdict}", "", f"**{result.title}** ({result.source})", ""]
    if result.notes:
        lines += [result.notes.strip(), ""]
    sequential = bool(result.rounds)
    lines += [
        (
            f"{result.scale} scale: seeds {result.seeds}, {result.steps} steps, {duration(result.wall_seconds)}; "
            f"{result.test}"
            + (
                "; a claim on one variant at two splits: the paired t-test"
                if any(c.claim.paired for c in result.claims)
                else ""
            )
            + (
                "; runs paired by seed (shared initial weights where names and shapes agree): claims between "
                "variants by the paired t-test on the per-seed differences"
                if result.pairing == "seeds"
                else ""
            )
            + "; Student-t intervals over seeds (costs on the log scale, bounded metrics on the "
            f"arcsine-square-root scale). Rerun: `{result.command}`. Full comparison: "
            f"[{result.report}]({result.report})."
        ),
        "",
    ]
    if sequential:
        lines += [
            (
                f"Seeds added until decided: looks at {', '.join(str(len(r['seeds'])) for r in result.rounds)} "
                f"seeds; {result.stopped}. Each look spends its share of alpha = {ALPHA} (Lan-DeMets Pocock-type "
                "spending), shared among the claims by Bonferroni's correction counted in the statements that can "
                "be false at once; a claim keeps the verdict, seeds and interval of the look that decided it."
            ),
            "",
        ]
    lines += [
        "| claim | effect | a | b | a - b [CI] | CI level | seeds | p | verdict |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    for c in result.claims:
        cl = c.claim
        where = f"{cl.task}, {cl.metric}" if c.probe else f"{cl.task}, {cl.split} {cl.metric}"
        if cl.metric == SENSITIVITY:
            over = next((s.over for s in result.sweeps if s.task == cl.task), "the swept option")
            where = f"{cl.task}, {SENSITIVITY} of the final test loss to {over}, lower is better"
        if cl.split_b and not c.probe:
            where = f"{cl.task}, {cl.metric}: a on {cl.split}, b on {cl.split_b}" + (
                ", paired by seed" if cl.paired else ""
            )
        delta = format_cell(difference_cell(c))
        p = "n/a" if c.p is None else f"{c.p:.3g}"
        effect = "n/a" if cl.relation == "steadier" else f"{c.effect:g}"
        level = f"{100 * c.confidence:.3g}%" + (f" (look {c.look})" if c.look else "")
        lines.append(
            f"| {cl.statement} ({where}; {cl.relation}) | {effect} | {cl.a}: {format_cell(c.a)} | {cl.b}: "
            f"{format_cell(c.b)} | {delta} | {level} | {c.seeds}{' paired' if c.paired else ''} | {p} | "
            f"**{verdict_words(c)}** |"
        )
    widths = [c for c in result.claims if c.unpaired_low is not None and c.low is not None]
    if widths:
        lines += [
            "",
            "The paired interval against Welch's unpaired one on the same runs (width = high - low):",
            "",
            "| claim | paired width | unpaired width | paired / unpaired |",
            "|---|---|---|---|",
        ]
        for c in widths:
            paired, unpaired = c.high - c.low, c.unpaired_high - c.unpaired_low
            ratio = "n/a" if unpaired == 0 else f"{paired / unpaired:.2f}"
            lines.append(f"| {c.claim.statement} | {paired:.4g} | {unpaired:.4g} | {ratio} |")
    lines += [
        "",
        *[f"- {c.claim.statement}: {c.verdict}. {c.reason[0].upper() + c.reason[1:]}." for c in result.claims],
    ]
    if result.short_runs:
        lines += [
            "",
            f"**{len(result.short_runs)} run(s) stopped at the time cap before their steps**, so "
            "the verdicts above compare runs trained for different numbers of steps: "
            + "; ".join(result.short_runs)
            + ".",
        ]
    if result.tally is not None and result.tallies:
        lines += ["", *tally_lines(result.tally, result.tallies, result.test)]
    if result.sweeps:
        lines += ["", *sweep_report_lines(result.sweeps, result.plots, heading="##")]
    if result.figures:
        lines += [
            "",
            "The source's figures beside ours (mean [95% CI] over seeds, at this scale):",
            "",
            "| variant | task | metric | source | ours | where the source gives it |",
            "|---|---|---|---|---|---|",
        ]
        lines += [
            f"| {f.figure.variant} | {f.figure.task} | {f.figure.split} {f.figure.metric} | "
            f"{format_number(f.figure.value, 3)} | {format_cell(f.ours)} | {f.figure.where} |"
            for f in result.figures
        ]
    return lines


def _mean_and_interval(values: list[float]) -> Cell | None:
    """The mean of ``values`` and its 95% interval; None when there are none."""
    if not values:
        return None
    found = interval(values)
    return Cell(mean=found.mean, low=found.low, high=found.high, n=found.n)


def sweep_lines(swept: SweepResult) -> list[str]:
    """A sweep's table: each swept variant's final test loss at each value (mean [95% CI] over the
    seeds whose run finished, and how many diverged), its largest attention logit where measured,
    and its sensitivity over seeds."""
    logits = any(p.max_logit is not None for v in swept.variants for p in v.points)
    lines = [
        f"| variant | {swept.over} | final test loss (nats) | diverged |"
        + (" largest attention logit |" if logits else ""),
        "|---|---|---|---|" + ("---|" if logits else ""),
    ]
    for variant in swept.variants:
        for value in swept.values:
            points = [p for p in variant.points if p.value == value]
            losses = [p.loss for p in points if p.loss is not None]
            loss = format_cell(_mean_and_interval(losses))
            row = f"| {variant.variant} | {value:g} | {loss} | {len(points) - len(losses)} of {len(points)} |"
            if logits:
                largest = _mean_and_interval([p.max_logit for p in points if p.max_logit is not None])
                row += f" {format_cell(largest)} |"
            lines.append(row)
    lines += [""]
    for variant in swept.variants:
        seeds = sorted(variant.sensitivity)
        initial = _mean_and_interval([variant.initial[s] for s in seeds])
        sensitivity = _mean_and_interval([variant.sensitivity[s] for s in seeds])
        lines.append(
            f"- {variant.variant}: sensitivity {format_cell(sensitivity)} over "
            f"{len(seeds)} seed(s); loss at initialisation {format_cell(initial)}"
            + (f"; runs that failed otherwise, left out: {'; '.join(variant.missing)}" if variant.missing else "")
        )
    return lines


def sweep_report_lines(sweeps: list[SweepResult], plots: list[str], heading: str = "##") -> list[str]:
    """Each sweep's section: what was swept, its table (:func:`sweep_lines`) and its figures."""
    lines = []
    for swept in sweeps:
        lines += [
            f"{heading} Sweep over {swept.over} on {swept.task}",
            "",
            (
                f"Each swept variant ran once per value of {swept.over} and seed. Its **sensitivity** at a seed "
                "(Wortsman et al. 2023, eq. 1) is the mean over the values of its final test loss, capped at the "
                "test loss of its initial weights (a run that diverged counts as that loss), less its best final "
                "loss over the values; lower is better."
            ),
            "",
            *sweep_lines(swept),
            "",
            *[f"![{name}]({name})" for name in plots if f"-{swept.task}." in name],
            "",
        ]
    return lines[:-1]


def difference_cell(c: ClaimResult) -> Cell | None:
    """A claim's ``a - b`` and its interval as a cell; None when a side has no figure."""
    return None if c.difference is None else Cell(mean=c.difference, low=c.low, high=c.high, n=c.seeds)


def verdict_words(c: ClaimResult) -> str:
    """A claim's verdict with its qualifier: smaller than the effect of interest, or the verdict an
    inconclusive one leans to."""
    if c.below_effect:
        return f"{c.verdict} (smaller than the effect of interest)"
    if c.leaning:
        return f"{c.verdict} (nearer to {c.leaning})"
    return c.verdict


def studies_table_lines(results: list[StudyResult]) -> list[str]:
    """One row per study: claim | source | figures | verdict | time."""
    lines = [
        "| study | claim | source | our figures (mean [CI]; seeds, steps) | verdict | time |",
        "|---|---|---|---|---|---|",
    ]
    for r in results:
        figures = "; ".join(
            f"{c.claim.a} {format_cell(c.a)} vs {c.claim.b} {format_cell(c.b)} "
            f"({c.claim.task} {c.claim.metric}: {verdict_words(c)}, {c.seeds} seeds{' paired' if c.paired else ''})"
            for c in r.claims
        )
        short = f"; {len(r.short_runs)} run(s) stopped at the time cap" if r.short_runs else ""
        lines.append(
            f"| [{r.name}]({r.name}/verdict.md) | {r.title} | {r.source} | {figures}; {len(r.seeds)} seeds, "
            f"{r.steps} steps{short} | **{r.verdict}** | {duration(r.wall_seconds)} |"
        )
    return lines


def claims_table_lines(results: list[StudyResult]) -> list[str]:
    """One row per claim of every study: its effect, figures, the seeds it was judged on (and
    whether paired), the paired interval's width against the unpaired one, and its verdict; then
    the share of claims decided."""
    lines = [
        "| study | claim | effect | a - b [CI] | CI level | seeds | paired / unpaired width | verdict |",
        "|---|---|---|---|---|---|---|---|",
    ]
    claims = [(r, c) for r in results for c in r.claims]
    for r, c in claims:
        delta = format_cell(difference_cell(c))
        widths = "n/a"
        if c.unpaired_low is not None and c.low is not None and c.unpaired_high != c.unpaired_low:
            widths = f"{(c.high - c.low) / (c.unpaired_high - c.unpaired_low):.2f}"
        effect = "n/a" if c.claim.relation == "steadier" else f"{c.effect:g}"
        needed = f"; about {c.seeds_needed} seeds a side would decide it" if c.seeds_needed else ""
        lines.append(
            f"| {r.name} | {c.claim.statement} ({c.claim.relation}) | {effect} | {delta} | "
            f"{100 * c.confidence:.3g}% | {c.seeds}{' paired' if c.paired else ''} | {widths} | "
            f"**{verdict_words(c)}**{needed} |"
        )
    decided = sum(c.verdict != "inconclusive" for _, c in claims)
    lines += ["", f"{decided} of {len(claims)} claims decided ({decided / max(len(claims), 1):.0%})."]
    return lines
