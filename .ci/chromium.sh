#!/usr/bin/env bash
# Headless Chromium and its driver from the distribution's packages, for the browser tests
# (tests/browser_pages.py drives them through Selenium). Installs chromium and
# chromium-driver with apt where either is missing (as root, the way .ci/slurm/up.sh
# installs Slurm); does nothing where both are there. Every step is bounded in time.
set -euo pipefail

have() { command -v "$1" >/dev/null 2>&1; }
if have chromium && have chromedriver; then
  echo "chromium: $(chromium --version 2>/dev/null | head -1); $(chromedriver --version | head -1)"
  exit 0
fi
[[ $(id -u) == 0 ]] || { echo "chromium.sh: run as root to install chromium and chromium-driver" >&2; exit 1; }
ls /var/lib/apt/lists/*_Packages* >/dev/null 2>&1 || timeout 300 apt-get update -qq
if ! DEBIAN_FRONTEND=noninteractive timeout 900 apt-get install -y -qq --no-install-recommends \
    chromium chromium-driver >/dev/null; then
  # an old package list names versions the mirror no longer has: refresh it once
  timeout 300 apt-get update -qq
  DEBIAN_FRONTEND=noninteractive timeout 900 apt-get install -y -qq --no-install-recommends \
    chromium chromium-driver >/dev/null
fi
have chromium && have chromedriver || { echo "chromium.sh: chromium or chromedriver missing after install" >&2; exit 1; }
echo "chromium: installed $(chromedriver --version | head -1)"
