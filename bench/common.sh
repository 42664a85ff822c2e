# Helpers the host benchmarks share (sourced by bench/host.sh, bench/moe.sh).

median_ms() { # planc's step lines on stdin -> median of steps 3..N
  grep -o '| [0-9.]* ms' | awk 'NR > 2 {print $2}' | sort -n |
    awk '{a[NR] = $1} END {print a[int((NR + 1) / 2)]}'
}
best() { printf '%s\n' "$@" | sort -n | head -1; }
