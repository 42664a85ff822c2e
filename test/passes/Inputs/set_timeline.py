import re, sys
# Usage: set_timeline.py FILE RANK UNIT:MB,UNIT:MB,... -- prints FILE with
# the body of `rank.timeline RANK` replaced by those rank.exec ops (a
# hand-written, possibly broken, schedule for plan-schedule-pipeline) in the
# training step.
src, rank, pairs = sys.argv[1], sys.argv[2], sys.argv[3]
text = open(src).read()
body = "".join(f"        rank.exec {u} mb {m}\n" for u, m in (p.split(":") for p in pairs.split(",")) if u)
# The training step's pipeline (the forward function has one too).
at = text.index("func.func @plan_step")
text = text[:at] + re.sub(r"(rank\.timeline %s \{\n)(.*?)(      \})" % rank, lambda mo: mo.group(1) + body + mo.group(3), text[at:], count=1, flags=re.S)
sys.stdout.write(text)
