"""The comparison's sizes and cases, shared by ours.py, original.py and compare.py (no
imports: each venv reads it)."""
BATCH, DIM, HEADS, CHUNK = 2, 32, 4, 16
# (case, L, causal, M as a multiple of L): M = L is the original's (it takes M = the input's
# length; ours is built with max_len = L). The control weighs pairs by another M (2L), a
# difference the comparison must see.
CASES = (("bidirectional L64", 64, False, 1), ("causal L64", 64, True, 1),
         ("causal L50", 50, True, 1), ("bidirectional L50", 50, False, 1),
         ("control: causal L64, M = 2L", 64, True, 2))
PARAMS = ("query", "key", "value", "out")
