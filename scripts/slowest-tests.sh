#!/usr/bin/env bash
# The N slowest tests of a nextest run, from its JUnit report (.config/nextest.toml writes
# target/nextest/default/junit.xml): `scripts/slowest-tests.sh JUNIT [N]`. `just test-all` ends
# with it; docs/benchmarks.md ("Development") says why the slowest are slow.
set -euo pipefail
junit=${1:?usage: slowest-tests.sh JUNIT [N]}
n=${2:-10}
python3 - "$junit" "$n" <<'PY'
import sys
import xml.etree.ElementTree as ET

root = ET.parse(sys.argv[1]).getroot()
cases = [
    (float(c.get("time", "0")), f'{c.get("classname", "")} {c.get("name", "")}')
    for c in root.iter("testcase")
]
cases.sort(reverse=True)
total = sum(t for t, _ in cases)
print(f"the {sys.argv[2]} slowest of {len(cases)} tests ({total:.0f} s of test time in all):")
for t, name in cases[: int(sys.argv[2])]:
    print(f"  {t:8.1f} s  {name}")
PY
