#!/usr/bin/env bash
# First contact with a GPU machine (and after any change to the GPU code): the meters' self-test,
# the gpu-marked tests and a short run on the GPU, then the figures a reviewer needs — counter vs
# integrated energy, the sampler's achieved rate, update periods, window lengths, idle power,
# allocator vs NVML memory, each window's energy grade and the GPU's temperature at its edges; then
# --settle, and a sweep at two power limits (where this process may set them).  Under 10 minutes: every
# step has its own time limit.
#
#   scripts/gpu-first-contact.sh [OUTPUT_FOLDER]     (default gpu-first-contact-<time>)
#
# Everything printed is also kept in OUTPUT_FOLDER (check.json, gpu-tests.txt, the run's store).
set -uo pipefail
cd "$(dirname "$0")/.."
OUT=${1:-gpu-first-contact-$(date -u +%Y%m%d-%H%M%S)}
mkdir -p "$OUT"
PY=${PYTHON:-python}
status=0
step() { printf '\n== %s ==\n' "$*"; }

step "machine"
nvidia-smi --query-gpu=name,uuid,driver_version,power.draw,memory.used --format=csv 2>&1 | tee "$OUT/nvidia-smi.txt"
timeout 30 petlprof meters | tee "$OUT/meters.txt"

step "petlprof meters --check (at most 180 s)"
timeout 180 petlprof meters --check --json >"$OUT/check.json" || status=1
"$PY" - "$OUT/check.json" <<'PYEOF'
import json, sys
try:
    meters = json.load(open(sys.argv[1]))["meters"]
except (OSError, ValueError) as error:
    sys.exit(f"no check results: {error}")
for meter in meters:
    print(f"{meter['meter']} ({'available' if meter['available'] else 'unavailable'}: {meter['detail']})")
    for c in meter["checks"]:
        print(f"  {c['verdict'].upper():<4}  {c['name']}: {c['value']} {c['unit'] or ''}  ({c['detail']})")
PYEOF

step "gpu-marked tests (at most 120 s)"
timeout 120 "$PY" -m pytest -q -s -m gpu -p no:cacheprovider tests/test_meters.py tests/test_power.py 2>&1 \
    | tee "$OUT/gpu-tests.txt"
[ "${PIPESTATUS[0]}" -eq 0 ] || status=1

step "short run on the GPU with --settle (at most 240 s)"
timeout 240 petlprof run --device cuda --methods lora,bitfit --train-size 256 --eval-size 128 --max-steps 60 \
    --batch-size 16 --max-length 64 --settle --output "$OUT/run" 2>&1 | tail -n 25
[ "${PIPESTATUS[0]}" -eq 0 ] || status=1

step "two power limits: the GPU's highest and 70% of it (at most 150 s; skipped where it may not be set)"
limits=$("$PY" - <<'PYEOF'
import pynvml
pynvml.nvmlInit()
low, high = pynvml.nvmlDeviceGetPowerManagementLimitConstraints(pynvml.nvmlDeviceGetHandleByIndex(0))
print(f"{max(low, 0.7 * high) / 1000:.0f}W,{high / 1000:.0f}W")
PYEOF
)
echo "limits: $limits"
timeout 150 petlprof run --device cuda --methods lora --train-size 256 --eval-size 128 --max-steps 60 \
    --batch-size 16 --max-length 64 --power-limit "$limits" --output "$OUT/power-limit" 2>&1 | tail -n 12
code=${PIPESTATUS[0]}
[ "$code" -eq 0 ] || [ "$code" -eq 2 ] || status=1  # 2: refused up front (no right to set it), said above
nvidia-smi --query-gpu=power.limit,power.default_limit --format=csv 2>&1 | tee "$OUT/power-limit-after.txt"

step "figures of the run"
"$PY" - "$OUT/run/results.jsonl" <<'PYEOF'
import json, sys
try:
    records = [json.loads(line) for line in open(sys.argv[1]) if line.strip()]
except OSError as error:
    sys.exit(f"no run records: {error}")
from petlprof.results.figures import FIGURES

# every declared figure with its unit, then the meters' diagnostics that are not figures
fields = [(f.name, f" {f.unit}") for f in FIGURES] + [
    ("energy_integrated_vs_counter", " x"), ("energy_sources_disagree", ""), ("power_field", ""),
    ("power_sample_rate_hz", " Hz"), ("counter_update_period_s", " s"), ("power_update_period_s", " s"),
    ("idle_power_source", ""), ("energy_low_confidence", ""), ("nvml_peak_process_memory_bytes", " B"),
    ("energy_kind", ""), ("energy_source", ""), ("memory_source", ""), ("energy_grade", ""),
    ("energy_grade_reasons", ""), ("energy_above_idle_grade", ""), ("gpu_temperature_start_c", " C"),
    ("gpu_temperature_end_c", " C"), ("gpu_sm_clock_start_mhz", " MHz"), ("gpu_sm_clock_end_mhz", " MHz"),
    ("gpu_power_limit_w", " W"), ("settle_s", " s"), ("settle_start_c", " C"), ("settle_end_c", " C"), ("settled", ""),
]
for record in records:
    print(f"{record.get('method')} seed {record.get('seed')}: status {record.get('status')} {record.get('error') or ''}")
    print(f"  idle baseline: {record.get('idle_baseline')}")
    for phase in ("train", "eval"):
        figures = record.get(phase) or {}
        print(f"  {phase}: " + ", ".join(f"{k}={figures.get(k)}{u}" for k, u in fields if k in figures))
        for warning in figures.get("warnings") or []:
            print(f"    warning: {warning}")
    for name, figures in (record.get("inference") or {}).items():
        if isinstance(figures, dict):
            print(f"  inference {name}: " + ", ".join(f"{k}={figures.get(k)}{u}" for k, u in fields if k in figures))
PYEOF

step "done: status $status (0 = every step passed), outputs in $OUT"
exit $status
