"""The numbers that decide a verdict's words: where "the link is the limit" begins, where a
weak-scaling efficiency "scales", when overlap is "hidden", when a MoE rank is "balanced",
when two sub-stages share the decision. The report's words are chosen by these bounds alone
(report/judgements.py, report/overlap_view.py, report/moe_view.py); a reader who wants to
know why a line says what it says finds every bound here, with its reason."""
from __future__ import annotations

# A rate as a share (%) of its link's line rate: at or above each bound, the words of that
# band. 80 %: what tuned NCCL reaches on a link it saturates; 50 %: within 2x of it; below
# 20 %: the bytes are too few for the link to matter, per-operation overhead decides.
CEILING_AT_LINK_PCT = 80.0
CEILING_GOOD_PCT = 50.0
CEILING_BELOW_PCT = 20.0

# Weak-scaling efficiency (%, per-rank throughput at n / at the smallest n): at or above 90 %
# the per-rank rate holds; at or above 70 % some is lost; below, it drops.
EFFICIENCY_SCALES_PCT = 90.0
EFFICIENCY_SOME_LOSS_PCT = 70.0

# Small-message p50 over the profile's latency floor (one message between two ranks): below
# 0.8x the floor was measured on another path; up to 2x is what the link allows; up to 5x a
# few steps or per-call overhead; beyond, per-call overhead dominates.
LATENCY_BELOW_FLOOR_X = 0.8
LATENCY_LINK_X = 2.0
LATENCY_FEW_STEPS_X = 5.0

# OSU's overlap % (communication hidden behind compute): at or above 80 % hidden, at or above
# 30 % partly hidden, below that mostly exposed.
OVERLAP_HIDDEN_PCT = 80.0
OVERLAP_PARTLY_PCT = 30.0

# A MoE stage's hottest-rank load (max / mean rows received): up to 1.1 balanced, up to 1.5
# moderate skew, beyond that the hottest rank sets the stage time.
LOAD_BALANCED = 1.1
LOAD_MODERATE = 1.5

# Two MoE sub-stages whose times are this close (ratio) share the decision: p50s of one run
# move by more than that on a shared host.
STAGE_CLOSE_RATIO = 1.25

# A padding factor (bytes sent / routed) up to this is no news in a table by default: the
# count headers a low-latency dispatch sends with its rows add well under 5 % at decode shapes.
PADDING_SHOWN = 1.05

# The pairs test (analyse/pairs.py): a pair is an outlier when its bandwidth is below the
# median - PAIRS_OUTLIER_MADS scaled MADs AND below PAIRS_FLOOR_X x the median. 3.5: the
# modified z-score bound of Iglewicz and Hoaglin, about 2 in 10,000 pairs of a normal matrix,
# so a matrix of dozens of pairs flags noise rarely and the re-test alone clears it; a larger
# bound misses a link at a third of the rate in a 15 %-noisy matrix of a few nodes. 0.7x: a
# healthy link on a quiet machine varies by a few %, never by 30 %, and a 30 % slower link
# costs every ring collective through it that much: below it is worth a name.
PAIRS_OUTLIER_MADS = 3.5
PAIRS_FLOOR_X = 0.7
