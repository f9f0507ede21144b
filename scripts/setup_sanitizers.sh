#!/usr/bin/env bash
# Tools for `make sanitize` and `make fuzz` (docs/fuzzing.md) on a fresh Debian machine:
#   gcc (the C tests under ASan + UBSan, with OpenMP) and clang with libFuzzer and the
#   sanitizer runtimes (Debian bookworm: clang 14, libclang-rt-14-dev).
# Idempotent: does nothing when a clang that links -fsanitize=fuzzer is already there.
set -euo pipefail
CLANG=${CLANG:-clang}

fuzzer_links() {
  command -v "$CLANG" >/dev/null 2>&1 && command -v gcc >/dev/null 2>&1 || return 1
  local dir
  dir=$(mktemp -d)
  printf 'int LLVMFuzzerTestOneInput(const char* d, unsigned long n) { return 0; }\n' > "$dir/t.c"
  "$CLANG" -fsanitize=fuzzer,address,undefined "$dir/t.c" -o "$dir/t" >/dev/null 2>&1
  local ok=$?
  rm -rf "$dir"
  return $ok
}

if fuzzer_links; then
  echo "setup-sanitizers: $("$CLANG" --version | head -n 1) links libFuzzer + ASan + UBSan"
  exit 0
fi
if [ "$(id -u)" != 0 ] || ! command -v apt-get >/dev/null 2>&1; then
  echo "setup-sanitizers: need clang with libFuzzer (Debian: apt-get install clang libclang-rt-dev)" \
       "and gcc; not root or no apt-get, so not installing" >&2
  exit 1
fi
echo "setup-sanitizers: installing gcc, clang and the sanitizer/libFuzzer runtimes with apt-get"
apt-get update -qq
# the runtime package is versioned on bookworm (libclang-rt-14-dev); pick the one that
# matches the clang apt would install
ver=$(apt-cache policy clang | sed -n 's/^ *Candidate: *[0-9]*:\{0,1\}\([0-9][0-9]*\).*/\1/p')
pkgs="gcc clang"
if [ -n "$ver" ] && apt-cache show "libclang-rt-$ver-dev" >/dev/null 2>&1; then
  pkgs="$pkgs libclang-rt-$ver-dev"
fi
DEBIAN_FRONTEND=noninteractive apt-get install -y -qq $pkgs >/dev/null
fuzzer_links || { echo "setup-sanitizers: clang still cannot link -fsanitize=fuzzer" >&2; exit 1; }
echo "setup-sanitizers: $("$CLANG" --version | head -n 1) ready"
