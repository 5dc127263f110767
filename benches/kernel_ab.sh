#!/usr/bin/env bash
# Compares the decode kernel of two git revisions on this machine:
#   benches/kernel_ab.sh REV_A REV_B [ROWS] [ROUNDS]
# (defaults: 8 input rows, 15 rounds; REV_B may be WORKTREE for the uncommitted checkout).
#
# Builds crates/lmplex-model/examples/qmatmul_timing at each revision (the current file is
# copied in where a revision lacks it), then runs the two binaries in alternation, ROUNDS
# times each, and prints per shape the fastest time of each and B/A. Alternating and keeping
# minima is what makes a 2-5% kernel change visible here: end to end, this machine's speed
# moves by 10-20% between phases, and criterion's seconds-long blocks land in different ones.
set -euo pipefail
A=${1:?usage: kernel_ab.sh REV_A REV_B [ROWS] [ROUNDS]}
B=${2:?usage: kernel_ab.sh REV_A REV_B [ROWS] [ROUNDS]}
ROWS=${3:-8}
ROUNDS=${4:-15}
ROOT=$(git rev-parse --show-toplevel)
EXAMPLE=crates/lmplex-model/examples/qmatmul_timing.rs
WORK=$(mktemp -d)
trap 'git -C "$ROOT" worktree remove --force "$WORK/a" 2>/dev/null; git -C "$ROOT" worktree remove --force "$WORK/b" 2>/dev/null; rm -rf "$WORK"' EXIT

build() { # build REV NAME: the timing binary of REV at $WORK/NAME.bin
  local src=$ROOT
  if [ "$1" != WORKTREE ]; then
    src=$WORK/$2
    git -C "$ROOT" worktree add -q --detach "$src" "$1"
    [ -f "$src/$EXAMPLE" ] || cp "$ROOT/$EXAMPLE" "$src/$EXAMPLE"
  fi
  # One target directory: the dependencies build once for both revisions.
  (cd "$src" && cargo build --release -q -p lmplex-model --example qmatmul_timing --target-dir "$ROOT/target")
  cp "$ROOT/target/release/examples/qmatmul_timing" "$WORK/$2.bin"
}
build "$A" a
build "$B" b

echo "shapes: $("$WORK/a.bin" --shapes)"
for _ in $(seq "$ROUNDS"); do
  echo "A $("$WORK/a.bin" "$ROWS")"
  echo "B $("$WORK/b.bin" "$ROWS")"
done | python3 -c '
import sys
best = {}
for line in sys.stdin:
    key, *vals = line.split()
    vals = [float(v) for v in vals]
    best[key] = [min(a, b) for a, b in zip(best.get(key, vals), vals)]
for key in "AB":
    print(key, "us ", " ".join(f"{x:9.1f}" for x in best[key]))
print("B/A   ", " ".join(f"{b / a:9.3f}" for a, b in zip(best["A"], best["B"])))
'
