#!/bin/sh
# The layers q3 keeps (the design's "Layout"; README, "How it is built"),
# checked on the sources and on the built objects. An arrow never points up.
# Lowest first (the order the includes of today's code give):
#
#   rank 0  util      errors (util/status.h, not q3.h), files, strings
#   rank 1  model     config, readers, dtypes, tensor names, quantizers
#   rank 2  graph     the op IR and its builders          (uses model)
#           kv        the KV pool                          (uses model)
#           text      tokenizer, chat template, JSON       (uses model)
#   rank 3  backend   compute units                        (uses graph, kv, model)
#   rank 4  plan      placement and policies               (uses backend)
#   rank 5  sample    sampler chain, logits processors
#   rank 6  run       context, session, the generation loop; q3.h is its face
#   rank 7  tools     offline work (tools/), in the q3 binary only
#   rank 8  cli       src/cli: q3.h, cli/, tools/ (and server/server.h, the
#                     serve command's entry)
#           server    src/server: q3.h and server/ only
#
# Layers of one rank are peers: neither includes nor calls the other.
#
# (a) includes: each `#include "x/..."` of a file under src/ or tools/ names
#     its own layer or one of a lower rank. q3.h, the public API, counts as
#     run's; a file below run may include it only when it implements a public
#     function (its object defines a symbol libq3.so exports), and a header
#     only when the .c of the same name does.
# (b) nm: each object's undefined symbols that some other object of src/ or
#     tools/ defines are defined in its own layer or a lower one; for cli
#     (besides tools/ and server's entry) and server, only what libq3.so
#     exports (nm -D --defined-only).
# (c) every function q3.h marks Q3_API is exported by libq3.so (a file that
#     stops including q3.h would make its public function hidden).
#
# Prints every violation, one a line:
#   FILE: includes X (layer A -> higher layer B)
#   OBJ: calls SYM defined in layer B (layer A)
# and exits 1 on any. scripts/check-layers.allow lists the violations of
# src/server accepted for now (one a line, as printed; # comments); it may
# hold nothing else, and an entry nothing matches any more is reported so it
# can go. Needs a build: BUILD=build by default (make check-layers builds it).
set -u
export LC_ALL=C # sort and join agree on one order
cd "$(dirname "$0")/.."
BUILD=${BUILD:-build}
ALLOW=scripts/check-layers.allow
lib="$BUILD/libq3.so"
[ -e "$lib" ] || { echo "check-layers: $lib missing (run make first)"; exit 2; }
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT

# layer of a path: src/LAYER/... or tools/... (BUILD/ in front for objects)
layer_awk='function layer(p) { sub("^" build "/", "", p); if (p ~ /^tools\//) return "tools";
  if (p ~ /^src\/[a-z_]+\//) { sub(/^src\//, "", p); sub(/\/.*/, "", p); return p } return "?" }'
cat > "$tmp/ranks" <<'EOF'
util 0
model 1
graph 2
kv 2
text 2
backend 3
plan 4
sample 5
grammar 5
run 6
api 6
tools 7
cli 8
server 8
EOF

# ---- the objects: what each defines and what each needs ----
objs=""
for src in $(find src tools -name '*.c' | sort); do
  o="$BUILD/${src%.c}.o"
  [ -e "$o" ] || { echo "check-layers: $o missing (run make first)"; exit 2; }
  objs="$objs $o"
done
# shellcheck disable=SC2086
nm -A $objs > "$tmp/nm" || exit 2
# SYM OBJ LAYER: global definitions, and undefined references
awk -v build="$BUILD" -v defs="$tmp/defs.u" -v undefs="$tmp/undefs.u" "$layer_awk"'
  { split($1, a, ":"); o = a[1] }
  $2 ~ /^[TDBRCVWGS]$/ { print $3, o, layer(o) > defs }
  $2 == "U" { print $3, o, layer(o) > undefs }' "$tmp/nm"
sort -k1,1 -u "$tmp/defs.u" > "$tmp/defs"
sort -k1,1 "$tmp/undefs.u" > "$tmp/undefs"
nm -D --defined-only "$lib" | awk '$2 ~ /^[A-Z]$/ {print $3}' | sort -u > "$tmp/exports"
# objects that implement a public function
join "$tmp/exports" "$tmp/defs" | awk '{print $2}' | sort -u > "$tmp/implementers"

: > "$tmp/violations"
# ---- (a) includes ----
# FILE INCLUDE for every quoted include of src/ and tools/
# shellcheck disable=SC2046
grep -H '^[[:space:]]*#[[:space:]]*include[[:space:]]*"' $(find src tools -name '*.[ch]' | sort) |
  sed 's/^\([^:]*\):[^"]*"\([^"]*\)".*/\1 \2/' > "$tmp/includes"
awk -v build="$BUILD" -v ranks="$tmp/ranks" -v impl="$tmp/implementers" "$layer_awk"'
  BEGIN {
    while ((getline line < ranks) > 0) { split(line, a, " "); rank[a[1]] = a[2] }
    while ((getline line < impl) > 0) implements[line] = 1
  }
  {
    f = $1; from = layer(f); inc = $2
    if (inc == "q3.h") to = "api"
    else if (index(inc, "/")) to = substr(inc, 1, index(inc, "/") - 1)
    else next                                  # beside the file: its own layer
    if (to == from) next
    if (from == "cli") {
      if (inc == "q3.h" || to == "tools" || inc == "server/server.h") next
      printf "%s: includes %s (layer cli -> %s: the CLI sees q3.h, cli/, tools/ and server/server.h only)\n", f, inc, to
      next
    }
    if (from == "server") {
      if (inc == "q3.h") next
      printf "%s: includes %s (layer server -> %s: the server sees q3.h and server/ only)\n", f, inc, to
      next
    }
    if (!(to in rank)) { printf "%s: includes %s (layer %s -> %s, a folder no layer names)\n", f, inc, from, to; next }
    rf = rank[from]; rt = rank[to]
    if (to == "api") {
      if (rf >= rt) next
      obj = f; sub(/\.[ch]$/, ".o", obj); obj = build "/" obj
      if (obj in implements) next               # implements a public function, or is its header
      printf "%s: includes q3.h (layer %s -> higher layer api: only files that implement a public function)\n", f, from
    } else if (rt > rf) printf "%s: includes %s (layer %s -> higher layer %s)\n", f, inc, from, to
    else if (rt == rf) printf "%s: includes %s (layer %s -> peer layer %s)\n", f, inc, from, to
  }' "$tmp/includes" >> "$tmp/violations"

# ---- (b) nm: what each object calls ----
join "$tmp/undefs" "$tmp/defs" | awk -v ranks="$tmp/ranks" -v exports="$tmp/exports" '
  BEGIN {
    while ((getline line < ranks) > 0) { split(line, a, " "); rank[a[1]] = a[2] }
    while ((getline line < exports) > 0) public[line] = 1
  }
  {
    sym = $1; o = $2; l = $3; dl = $5             # SYM OBJ LAYER DEFOBJ DEFLAYER
    if (dl == l) next
    if (l == "cli" || l == "server") {
      if (l == "cli" && (dl == "tools" || dl == "server")) next
      if (sym in public) next
      printf "%s: calls %s defined in layer %s (layer %s: public symbols only)\n", o, sym, dl, l
      next
    }
    if (rank[dl] < rank[l]) next
    printf "%s: calls %s defined in layer %s (layer %s)\n", o, sym, dl, l
  }' >> "$tmp/violations"

# ---- (c) every Q3_API function leaves libq3.so ----
sed -n 's/^Q3_API[^(]*[ *]\(q3_[a-z0-9_]*\)(.*/\1/p' include/q3.h | sort -u | while read -r fn; do
  grep -qx "$fn" "$tmp/exports" || echo "include/q3.h: $fn is Q3_API but $lib does not export it"
done >> "$tmp/violations"

# ---- the allow-list (src/server only, for now) ----
: > "$tmp/allow"
if [ -f "$ALLOW" ]; then
  sed 's/[[:space:]]*#.*//; /^[[:space:]]*$/d' "$ALLOW" > "$tmp/allow"
  bad=$(grep -v -e '^src/server/' -e "^$BUILD/src/server/" -e '^build/src/server/' "$tmp/allow")
  [ -n "$bad" ] && { echo "check-layers: $ALLOW may list src/server's violations only, not:"; echo "$bad"; exit 1; }
  sed -i "s#^build/src/server/#$BUILD/src/server/#" "$tmp/allow"
fi
sort -u "$tmp/violations" > "$tmp/v"
sort -u "$tmp/allow" > "$tmp/a"
comm -23 "$tmp/v" "$tmp/a" > "$tmp/real"
n_allowed=$(comm -12 "$tmp/v" "$tmp/a" | wc -l)
comm -13 "$tmp/v" "$tmp/a" | sed "s#^#check-layers: no longer needed in $ALLOW: #"
cat "$tmp/real"
n=$(wc -l < "$tmp/real")
echo "check-layers: $n violations ($n_allowed of src/server allowed for now by $ALLOW)"
[ "$n" -eq 0 ]
