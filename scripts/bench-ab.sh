#!/usr/bin/env bash
# A/B engine timing of two mtserve binaries (e.g. a refactor against the commit before it): for
# every model, batch and backend, runs `A run` and `B run` alternately ROUNDS times and prints the
# median time of each and the ratio B/A (below 1: B is faster). Alternating in one run is what
# makes the comparison meaningful on a machine whose speed drifts by tens of percent within
# minutes; the spread of the per-round ratios is printed beside the median as the noise figure.
#
# Usage: scripts/bench-ab.sh A_BINARY B_BINARY
# Env knobs: AB_MODELS="a b" (names in models/out; default: all but tiny), AB_BATCHES="1 8",
# AB_THREADS=2, AB_BACKENDS="default reference", AB_ROUNDS=5, AB_ITERS=20 (runs per timing).
set -uo pipefail
cd "$(dirname "$0")/.."

A=${1:?usage: $0 A_BINARY B_BINARY}
B=${2:?usage: $0 A_BINARY B_BINARY}
MODELS=${AB_MODELS:-$(ls models/out/*.onnx | xargs -n1 basename | sed 's/\.onnx$//' | grep -v '^tiny$')}
BATCHES=${AB_BATCHES:-1 8}
THREADS=${AB_THREADS:-2}
BACKENDS=${AB_BACKENDS:-default reference}
ROUNDS=${AB_ROUNDS:-5}
ITERS=${AB_ITERS:-20}

jget() { printf '%s' "$2" | tr -d '\n' | grep -o "\"$1\": *[-0-9.eE+]*" | head -n1 | sed 's/.*: *//'; }
median() { printf '%s\n' "$@" | sort -g | awk '{a[NR]=$1} END {print a[int((NR+1)/2)]}'; }

time_one() { # BINARY MODEL BATCH BACKEND -> median ms (empty on failure)
    local out
    out=$(MTS_BACKEND=$4 timeout 600 "$1" run "models/out/$2.onnx" --batch "$3" --threads "$THREADS" \
          --iters "$ITERS" --dim S=64 --json 2>/dev/null) || return 0
    jget median_ms "$out"
}

echo "CPU: $(grep -m1 'model name' /proc/cpuinfo | sed 's/.*: //'), $(nproc) cores; A=$A B=$B"
echo "rounds=$ROUNDS iters=$ITERS threads=$THREADS"
echo
echo "| model | batch | backend | A ms | B ms | B/A | per-round B/A min..max |"
echo "|---|---|---|---|---|---|---|"
for m in $MODELS; do
    for b in $BATCHES; do
        for be in $BACKENDS; do
            as=() bs=() rs=()
            for ((r = 0; r < ROUNDS; r++)); do
                ta=$(time_one "$A" "$m" "$b" "$be"); tb=$(time_one "$B" "$m" "$b" "$be")
                [ -n "$ta" ] && [ -n "$tb" ] || continue
                as+=("$ta") bs+=("$tb") rs+=("$(awk "BEGIN { printf \"%.3f\", $tb / $ta }")")
            done
            if [ ${#rs[@]} -eq 0 ]; then
                echo "| $m | $b | $be | failed | failed | - | - |"
                continue
            fi
            ma=$(median "${as[@]}"); mb=$(median "${bs[@]}")
            lo=$(printf '%s\n' "${rs[@]}" | sort -g | head -n1); hi=$(printf '%s\n' "${rs[@]}" | sort -g | tail -n1)
            printf '| %s | %s | %s | %.3f | %.3f | %.3f | %s..%s |\n' "$m" "$b" "$be" "$ma" "$mb" \
                "$(awk "BEGIN { print $mb / $ma }")" "$lo" "$hi"
            echo "bench-ab: $m batch $b $be done" >&2
        done
    done
done
