#!/usr/bin/env bash
# Installs what crates/service/tests/browser.rs drives: Debian's chromium and chromium-driver.
# Safe to run again; does nothing when both are already on PATH.
set -euo pipefail
if command -v chromium >/dev/null 2>&1 && command -v chromedriver >/dev/null 2>&1; then
    echo "browser-setup: chromium and chromedriver already installed"
    exit 0
fi
export DEBIAN_FRONTEND=noninteractive
apt-get update -qq
apt-get -y -qq install chromium chromium-driver
chromium --version
chromedriver --version
