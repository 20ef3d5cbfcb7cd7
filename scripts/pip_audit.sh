#!/usr/bin/env bash
# Known vulnerabilities in the gateway's .venv (pip-audit, PyPI's advisories), as a short summary.
# Advisory only: it never fails the run. An advisory with no fixed release yet, a version PyPI does not list
# (a local mirror's build), or no network must not stop `make test`; the summary says what was and was not checked.
set -uo pipefail
cd "$(dirname "$0")/.."

report=$(mktemp)
trap 'rm -f "$report"' EXIT
timeout "${BOTGW_AUDIT_TIMEOUT_S:-120}" .venv/bin/pip-audit --format json --progress-spinner off --skip-editable \
  --output "$report" >/dev/null 2>&1
status=$?
if [ ! -s "$report" ]; then
  echo "pip-audit: no report (exit $status: timed out, no network or not installed); not failing the run"
  exit 0
fi
.venv/bin/python - "$report" <<'PY' || echo "pip-audit: unreadable report; not failing the run"
import json
import sys

deps = json.load(open(sys.argv[1])).get("dependencies", [])
skipped = [d for d in deps if "skip_reason" in d]
found = [(d, v) for d in deps for v in d.get("vulns", [])]
print(f"pip-audit: {len(deps) - len(skipped)} packages audited against PyPI's advisories, {len(skipped)} not "
      f"(not on PyPI at that version, or editable), {len(found)} known vulnerabilities")
for dep, vuln in found:
    fixed = ", ".join(vuln.get("fix_versions") or []) or "no fixed release yet"
    print(f"  {dep['name']} {dep['version']}: {vuln['id']} (fixed in {fixed})")
PY
exit 0
