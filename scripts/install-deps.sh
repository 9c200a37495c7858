#!/bin/sh
# Installs what q3 needs to build and test on a fresh Debian machine.
# Build: gcc/make; libraries: cJSON (JSON), PCRE2 (tokenizer regex), utf8proc (NFC, Unicode classes);
# libmicrohttpd (q3 serve: HTTP with chunked responses from a callback and suspend/resume);
# pkg-config (the examples build against the installed q3.pc); clang + libFuzzer runtime for the fuzz targets (fuzz/); valgrind for `make valgrind`.
set -e
SUDO=""; [ "$(id -u)" = 0 ] || SUDO=sudo
need=""
for p in build-essential pkg-config libmicrohttpd-dev libcjson-dev libpcre2-dev libutf8proc-dev clang libclang-rt-14-dev valgrind; do
  dpkg -s "$p" >/dev/null 2>&1 || need="$need $p"
done
if [ -n "$need" ]; then
  $SUDO apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq $need
fi
