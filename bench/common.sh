# Helpers the host benchmarks share (sourced by bench/host.sh, bench/moe.sh,
# bench/moe-ep.sh).

# Enters a scratch directory (removed on exit) with the shipped text
# tokenized into data/, and sets CPU (the machine's model name). Needs ROOT
# and BUILD.
scratch_with_tokens() {
  TMP="$(mktemp -d)"
  trap 'rm -rf "$TMP"' EXIT
  export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
  cd "$TMP"
  mkdir -p data
  "$BUILD/bin/plan-tokenize" -o data/tiny "$ROOT/examples/data/tiny.txt" >/dev/null
  CPU="$(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2 | sed 's/^ //')"
}

median_ms() { # planc's step lines on stdin -> median of steps 3..N
  grep -o '| [0-9.]* ms' | awk 'NR > 2 {print $2}' | sort -n |
    awk '{a[NR] = $1} END {print a[int((NR + 1) / 2)]}'
}
best() { printf '%s\n' "$@" | sort -n | head -1; }
