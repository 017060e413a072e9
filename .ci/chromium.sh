#!/usr/bin/env bash
# Headless Chromium for the browser tests: Debian's chromium and chromium-driver, and a CJK font so the
# forms' Chinese labels render in screenshots instead of empty boxes; each when missing.
#
#   .ci/chromium.sh      install them (apt); prints the two versions
#
# The tests drive /usr/bin/chromium through /usr/bin/chromedriver with Selenium; nothing is downloaded at test time.
set -euo pipefail

log() { echo "chromium.sh: $*" >&2; }

need=()
command -v chromium >/dev/null || need+=(chromium)
command -v chromedriver >/dev/null || need+=(chromium-driver)
[[ -e /usr/share/fonts/truetype/wqy/wqy-zenhei.ttc ]] || need+=(fonts-wqy-zenhei)
if ((${#need[@]})); then
    log "installing ${need[*]}"
    export DEBIAN_FRONTEND=noninteractive
    apt-get install -y -qq --no-install-recommends "${need[@]}" >/dev/null \
        || { apt-get update -qq && apt-get install -y -qq --no-install-recommends "${need[@]}" >/dev/null; }
fi
chromium --version >&2
chromedriver --version >&2
