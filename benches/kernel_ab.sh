#!/usr/bin/env bash
# Compares the decode kernel of two git revisions on this machine:
#   benches/kernel_ab.sh REV_A REV_B [ROWS] [ROUNDS] [cold]
# (defaults: 8 input rows, 15 rounds; REV_B may be WORKTREE for the uncommitted checkout;
# `cold` cycles through copies of each matrix larger than the last-level cache, so that
# every call streams its weights from memory, as decode does).
#
# Builds crates/lmplex-cpu/examples/qmatmul_timing at each revision (the current file is
# copied in; a revision from before lmplex-cpu was split out of lmplex-model gets it in
# lmplex-model, its paths renamed), then runs the two binaries in alternation, ROUNDS
# times each, and prints per shape the fastest time of each and B/A. Alternating and keeping
# minima is what makes a 2-5% kernel change visible here: end to end, this machine's speed
# moves by 10-20% between phases, and criterion's seconds-long blocks land in different ones.
set -euo pipefail
A=${1:?usage: kernel_ab.sh REV_A REV_B [ROWS] [ROUNDS]}
B=${2:?usage: kernel_ab.sh REV_A REV_B [ROWS] [ROUNDS]}
ROWS=${3:-8}
ROUNDS=${4:-15}
COLD=$([ "${5:-}" = cold ] && echo --cold || true)
ROOT=$(git rev-parse --show-toplevel)
EXAMPLE=examples/qmatmul_timing.rs
WORK=$(mktemp -d)
trap 'git -C "$ROOT" worktree remove --force "$WORK/a" 2>/dev/null; git -C "$ROOT" worktree remove --force "$WORK/b" 2>/dev/null; rm -rf "$WORK"' EXIT

build() { # build REV NAME: the timing binary of REV at $WORK/NAME.bin
  local src=$ROOT pkg=lmplex-cpu
  if [ "$1" != WORKTREE ]; then
    src=$WORK/$2
    git -C "$ROOT" worktree add -q --detach "$src" "$1"
    [ -d "$src/crates/lmplex-cpu" ] || pkg=lmplex-model # the kernels' crate before the split
    # The same timing code for both.
    sed "s/lmplex_cpu::/${pkg//-/_}::/g" "$ROOT/crates/lmplex-cpu/$EXAMPLE" >"$src/crates/$pkg/$EXAMPLE"
  fi
  # A target directory per side (target/kernel_ab-a, -b): the two revisions' crates share
  # package ids, so in one directory each build replaced the other's artifacts, and cargo
  # could take a revision for fresh and hand back the other's binary. Each keeps its
  # dependencies between runs.
  local dir=$ROOT/target/kernel_ab-$2
  (cd "$src" && cargo build --release -q -p "$pkg" --example qmatmul_timing --target-dir "$dir")
  cp "$dir/release/examples/qmatmul_timing" "$WORK/$2.bin"
}
build "$A" a
build "$B" b

echo "shapes: $("$WORK/a.bin" --shapes)"
for _ in $(seq "$ROUNDS"); do
  echo "A $("$WORK/a.bin" "$ROWS" $COLD)"
  echo "B $("$WORK/b.bin" "$ROWS" $COLD)"
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
