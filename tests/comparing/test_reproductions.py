"""Every built-in study at its cpu scale, its seeds added until decided within 20 minutes (slow:
1 to 20 minutes each on a 2-core CPU), against the verdicts recorded in docs/reproductions.md. A
claim that did not hold is checked by the direction of its numbers too: a's gain over b stays
below its effect of interest."""

from __future__ import annotations

import pytest

from transformer_zoo.comparing.studies.running import reproduce
from transformer_zoo.comparing.studies.spec import load_study

RECORDED = {  # by study, each claim's verdict as it ran (docs/reproductions.md)
    "ut-length-generalisation": ["holds", "inconclusive"],
    "layernorm-vs-batchnorm": ["inconclusive", "inconclusive"],
    "scaled-dot-product": ["holds", "holds"],
    "local-vs-global": ["holds", "holds", "holds"],
    "multi-head": ["holds"],
    "pre-vs-post-norm": ["holds", "holds", "inconclusive"],
    "sagan-attention": ["inconclusive", "inconclusive"],
    "tuned-pre-vs-post-norm": ["holds", "inconclusive", "holds"],
    "length-extrapolation": ["holds", "holds", "holds", "does not hold", "holds", "inconclusive"],
    "modifications": ["holds", "holds", "holds"],
    "associative-recall": ["holds", "holds", "holds", "holds", "holds"],
    "mad": ["holds", "holds", "holds", "holds", "holds"],
    "chomsky-hierarchy": ["holds", "does not hold", "does not hold"],
    "small-scale-proxies": ["holds", "holds"],
    "modern-modifications": ["holds", "inconclusive", "inconclusive", "does not hold", "holds"],
}
UNTIL_DECIDED = {"until_decided": {"budget": "20m"}}


@pytest.mark.slow
@pytest.mark.parametrize("name", list(RECORDED))
def test_a_study_at_cpu_scale_gives_its_recorded_verdicts(name, tmp_path):
    result = reproduce(load_study(name), tmp_path, overrides=UNTIL_DECIDED)
    for outcome, recorded in zip(result.claims, RECORDED[name], strict=True):
        assert outcome.verdict == recorded, outcome.reason
        if recorded == "does not hold" and outcome.claim.relation == "better":
            sign = 1 if outcome.direction == "higher" else -1
            assert sign * outcome.difference < max(outcome.claim.effect, 1e-12), outcome.reason
