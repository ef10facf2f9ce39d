#!/usr/bin/env bash
# Derive the faulty fixtures from the healthy H200 capture by the edits below (and only those). Each edit is
# a literal substitution that must hit exactly once; rerun after changing h200-healthy/. Run from this folder.
set -euo pipefail
cd "$(dirname "$0")"
H=h200-healthy

# sub FILE OLD NEW: replace exactly one occurrence of OLD (fails when OLD is absent or repeated)
sub() {
    python3 - "$1" "$2" "$3" <<'PY'
import sys
path, old, new = sys.argv[1:]
text = open(path).read()
n = text.count(old)
if n != 1:
    sys.exit(f"{path}: {old!r} occurs {n} times, want exactly 1")
open(path, "w").write(text.replace(old, new))
PY
}
fresh() { rm -rf "$1"; mkdir -p "$1"; cp "$H"/nvidia-smi-q.xml "$H"/nvml.json "$1"/; }

# 1. a pending row remap after one uncorrectable DRAM error (NVML remapped_rows = corr, unc, pending, failure)
fresh remap-pending
sub remap-pending/nvidia-smi-q.xml "<remapped_row_unc>0</remapped_row_unc>" "<remapped_row_unc>1</remapped_row_unc>"
sub remap-pending/nvidia-smi-q.xml "<remapped_row_pending>No</remapped_row_pending>" "<remapped_row_pending>Yes</remapped_row_pending>"
sub remap-pending/nvml.json '"remapped_rows": [
    0,
    0,
    0,
    0
   ]' '"remapped_rows": [
    0,
    1,
    1,
    0
   ]'

# 2. HW slowdown active instead of idle (NVML bit 0x8), in the XML, NVML and the CSV query
fresh hw-slowdown
sub hw-slowdown/nvidia-smi-q.xml "<clocks_event_reason_gpu_idle>Active</clocks_event_reason_gpu_idle>" "<clocks_event_reason_gpu_idle>Not Active</clocks_event_reason_gpu_idle>"
sub hw-slowdown/nvidia-smi-q.xml "<clocks_event_reason_hw_slowdown>Not Active</clocks_event_reason_hw_slowdown>" "<clocks_event_reason_hw_slowdown>Active</clocks_event_reason_hw_slowdown>"
sub hw-slowdown/nvml.json '"clock_event_reasons": 1,' '"clock_event_reasons": 8,'
sed -n '/^## new names/,/^## old names/p' "$H"/queries.txt | sed '1d;$d' > hw-slowdown/clocks-new-names.csv
sub hw-slowdown/clocks-new-names.csv "0x0000000000000001, Not Active," "0x0000000000000008, Active,"

# 3. the same healthy GPU as a pre-535 driver prints it: clocks_throttle_reasons / clocks_throttle_reason_*
mkdir -p pre535-names; cp "$H"/nvidia-smi-q.xml pre535-names/
sed -i 's/clocks_event_reasons>/clocks_throttle_reasons>/; s/clocks_event_reason_/clocks_throttle_reason_/g' pre535-names/nvidia-smi-q.xml

# 4. two volatile uncorrectable DRAM ECC errors
fresh ecc-uncorrected
sub ecc-uncorrected/nvidia-smi-q.xml "<dram_uncorrectable>0</dram_uncorrectable>
			</volatile>" "<dram_uncorrectable>2</dram_uncorrectable>
			</volatile>"
sub ecc-uncorrected/nvml.json '"ecc_uncorrected_volatile": 0,' '"ecc_uncorrected_volatile": 2,'

# 5. the kernel log with an application Xid 13 and a hardware Xid 79 appended (line format of the 580 driver)
mkdir -p xid79
cp "$H"/dmesg.txt xid79/dmesg.txt
cat >> xid79/dmesg.txt <<'LOG'
[ 5012.118233] NVRM: Xid (PCI:0000:00:06): 13, pid=41877, name=python3, Graphics Exception: ESR 0x514648=0x1000f 0x514650=0x0 0x514644=0xd3eff2 0x51464c=0x17f
[ 7301.402117] NVRM: Xid (PCI:0000:00:06): 79, pid='<unknown>', name=<unknown>, GPU has fallen off the bus.
[ 7301.402140] NVRM: GPU 0000:00:06.0: GPU has fallen off the bus.
LOG

# 6. a second GPU of another architecture (an A100, cc 8.0) in the NVML dump
fresh mixed-arch
python3 - mixed-arch/nvml.json <<'PY'
import copy, json, sys
d = json.load(open(sys.argv[1]))
g = copy.deepcopy(d["gpus"][0])
g.update(index=1, name="NVIDIA A100-SXM4-80GB", uuid="GPU-00000000-0000-0000-0000-000000000001", cc=[8, 0])
d["gpus"].append(g)
json.dump(d, open(sys.argv[1], "w"), indent=1)
PY
rm mixed-arch/nvidia-smi-q.xml
