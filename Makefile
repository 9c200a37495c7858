# q3 — plain Makefile. `make` builds build/q3, build/libq3.a and build/libq3.so;
# `make test` runs the suite; `make SAN=1 test` builds into build-san/ with
# AddressSanitizer + UBSan (and float-cast-overflow, which UBSan leaves out: a
# float cast to an int it does not fit); `make install [PREFIX=/usr/local]
# [DESTDIR=]` installs the binary, both libraries, include/q3.h, q3.pc and the
# built-in tokenizer (share/q3/qwen3-tokenizer); `make uninstall` removes them.
CC      ?= cc
BUILD   ?= build
OPT     ?= -O2
CFLAGS  ?=
WARN    := -Wall -Wextra -Wno-unused-parameter -Wno-format-truncation $(if $(WERROR),-Werror)
# Position-independent everywhere (libq3.a can go into a shared object too);
# hidden visibility, so libq3.so exports only what include/q3.h marks Q3_API.
# -ffp-contract=off: no fused multiply-adds the source does not spell (GCC's default
# under -std=c17, not clang's); the quantizers match llama.cpp's bytes only so.
BASE    := -std=c17 -g $(OPT) -MMD -MP -Iinclude -Isrc -I. -D_GNU_SOURCE -fno-math-errno -ffp-contract=off -fPIC -fvisibility=hidden
LDLIBS  := -lcjson -lpcre2-8 -lutf8proc -lm -lpthread

ifeq ($(SAN),1)
BUILD   := build-san
BASE    += -fsanitize=address,undefined,float-cast-overflow -fno-omit-frame-pointer -fno-sanitize-recover=undefined,float-cast-overflow
LDFLAGS += -fsanitize=address,undefined,float-cast-overflow
endif

# `make TSAN=1 test [TESTS="test_serve test_batch"]`: ThreadSanitizer (no ASan) into build-tsan/.
# The per-ISA kernel files stay uninstrumented (they hold no synchronisation, only
# loads and stores of their (ith, nth) share): TSan then misses a race inside a
# kernel, never invents one, and the model runs ~5x faster under it.
ifeq ($(TSAN),1)
BUILD   := build-tsan
BASE    += -fsanitize=thread -fno-omit-frame-pointer
LDFLAGS += -fsanitize=thread
$(BUILD)/%_avx512.o $(BUILD)/%_avx2.o: BASE := $(filter-out -fsanitize=thread,$(BASE))
endif

# Per-ISA kernel files are compiled for their ISA only; the rest stays portable.
AVX512_FLAGS := -mavx512f -mavx512bw -mavx512dq -mavx512vl -mavx512bf16 -mavx512vnni -mfma -mf16c
AVX2_FLAGS   := -mavx2 -mfma -mf16c

# src/server (q3 serve) is an application on top of the library, like the CLI:
# it links into q3 and the tests, never into libq3, which so needs no libmicrohttpd.
LIB_SRC  := $(shell find src -name '*.c' ! -path 'src/cli/*' ! -path 'src/server/*' | sort)
SERVER_SRC := $(sort $(wildcard src/server/*.c))
SERVER_LIBS := -lmicrohttpd
CLI_SRC  := $(sort $(wildcard src/cli/*.c))
# tools/ (convert, compare, synth, the writers, bench, machine limits, and the
# commands' work on internals) is offline work: libq3tools.a links into q3, the
# tests and the benches, never into libq3.a or libq3.so.
TOOLS_SRC := $(sort $(wildcard tools/*.c))
TOOLS_LIB := $(BUILD)/libq3tools.a
TEST_SRC := $(sort $(wildcard tests/test_*.c))
BENCH_SRC:= $(sort $(wildcard bench/*.c))

LIB_OBJ  := $(LIB_SRC:%.c=$(BUILD)/%.o)
CLI_OBJ  := $(CLI_SRC:%.c=$(BUILD)/%.o)
SERVER_OBJ := $(SERVER_SRC:%.c=$(BUILD)/%.o)
TOOLS_OBJ := $(TOOLS_SRC:%.c=$(BUILD)/%.o)
TEST_BIN := $(TEST_SRC:tests/%.c=$(BUILD)/tests/%)
BENCH_BIN:= $(BENCH_SRC:bench/%.c=$(BUILD)/bench/%)

VERSION  := $(shell sed -n 's/^\#define Q3_VERSION_STRING "\(.*\)"/\1/p' include/q3.h)
SOMAJOR  := $(firstword $(subst ., ,$(VERSION)))
PREFIX   ?= /usr/local
LIBDIR   ?= $(PREFIX)/lib
INCDIR   ?= $(PREFIX)/include
BINDIR   ?= $(PREFIX)/bin
PCDIR    ?= $(LIBDIR)/pkgconfig
DATADIR  ?= $(PREFIX)/share/q3
# The built-in tokenizer (make deps fetches it): installed where an installed q3
# looks for it, BINDIR/../share/q3/qwen3-tokenizer (tools/defaults.c).
TOKENIZER_SRC := models/qwen3-tokenizer

# Stamps of what the outputs are built with, rewritten only when it changes:
# objects depend on their flags (`make WERROR=1 test` after `make` rebuilds
# with -Werror), q3.pc on the install directories (a second `make install
# PREFIX=B` does not install the first prefix's q3.pc).
FLAGS_STAMP := $(BUILD)/flags.stamp
DIRS_STAMP  := $(BUILD)/dirs.stamp
stamp = $(shell mkdir -p $(BUILD); [ "$$(cat $(1) 2>/dev/null)" = '$(2)' ] || printf '%s\n' '$(2)' > $(1))
$(call stamp,$(FLAGS_STAMP),$(CC) $(BASE) $(WARN) $(CFLAGS) $(LDFLAGS) $(AVX512_FLAGS) $(AVX2_FLAGS))
$(call stamp,$(DIRS_STAMP),$(PREFIX) $(LIBDIR) $(INCDIR))

all: $(BUILD)/q3 $(BUILD)/libq3.so $(TEST_BIN) $(BENCH_BIN)
	@echo "q3 $(VERSION): $(BUILD)/q3, $(BUILD)/libq3.so.$(VERSION), $(BUILD)/libq3.a, $(words $(TEST_BIN)) tests, $(words $(BENCH_BIN)) benches are up to date$(if $(WERROR), (-Werror)); next: ./$(BUILD)/q3 bench, make test"

$(BUILD)/libq3.a: $(LIB_OBJ)
	@mkdir -p $(@D)
	@rm -f $@
	ar rcs $@ $^

$(TOOLS_LIB): $(TOOLS_OBJ)
	@mkdir -p $(@D)
	@rm -f $@
	ar rcs $@ $^

# libq3.so.MAJOR.MINOR.PATCH with the soname libq3.so.MAJOR, and the two links.
$(BUILD)/libq3.so: $(LIB_OBJ)
	@mkdir -p $(@D)
	$(CC) -shared $(LDFLAGS) -Wl,-soname,libq3.so.$(SOMAJOR) -Wl,--no-undefined -o $@.$(VERSION) $^ $(LDLIBS)
	ln -sf libq3.so.$(VERSION) $@.$(SOMAJOR)
	ln -sf libq3.so.$(VERSION) $@

$(BUILD)/q3.pc: Makefile include/q3.h $(DIRS_STAMP)
	@mkdir -p $(@D)
	printf '%s\n' 'prefix=$(PREFIX)' 'libdir=$(LIBDIR)' 'includedir=$(INCDIR)' '' \
	  'Name: q3' 'Description: a Qwen3 inference engine in C' 'Version: $(VERSION)' \
	  'Libs: -L$${libdir} -lq3' 'Libs.private: $(LDLIBS)' 'Cflags: -I$${includedir}' > $@

install: $(BUILD)/q3 $(BUILD)/libq3.a $(BUILD)/libq3.so $(BUILD)/q3.pc
	install -d $(DESTDIR)$(BINDIR) $(DESTDIR)$(LIBDIR) $(DESTDIR)$(INCDIR) $(DESTDIR)$(PCDIR)
	install -m 755 $(BUILD)/q3 $(DESTDIR)$(BINDIR)/q3
	install -m 644 $(BUILD)/libq3.a $(DESTDIR)$(LIBDIR)/libq3.a
	install -m 755 $(BUILD)/libq3.so.$(VERSION) $(DESTDIR)$(LIBDIR)/libq3.so.$(VERSION)
	ln -sf libq3.so.$(VERSION) $(DESTDIR)$(LIBDIR)/libq3.so.$(SOMAJOR)
	ln -sf libq3.so.$(VERSION) $(DESTDIR)$(LIBDIR)/libq3.so
	install -m 644 include/q3.h $(DESTDIR)$(INCDIR)/q3.h
	install -m 644 $(BUILD)/q3.pc $(DESTDIR)$(PCDIR)/q3.pc
	@if [ -s $(TOKENIZER_SRC)/tokenizer.json ]; then \
	  echo install -d $(DESTDIR)$(DATADIR)/qwen3-tokenizer; install -d $(DESTDIR)$(DATADIR)/qwen3-tokenizer; \
	  for f in tokenizer.json tokenizer_config.json; do \
	    echo install -m 644 $(TOKENIZER_SRC)/$$f $(DESTDIR)$(DATADIR)/qwen3-tokenizer/$$f; \
	    install -m 644 $(TOKENIZER_SRC)/$$f $(DESTDIR)$(DATADIR)/qwen3-tokenizer/$$f || exit 1; done; \
	else echo "make install: no built-in tokenizer in $(TOKENIZER_SRC) (run make deps first): the installed q3 needs -m MODEL with its own tokenizer or --tokenizer PATH" >&2; fi
	@echo "installed q3 $(VERSION) into $(DESTDIR)$(PREFIX)"

# Removes what install wrote, then the folders it leaves empty (never one that
# still holds something else: rmdir refuses those).
uninstall:
	rm -f $(DESTDIR)$(BINDIR)/q3 $(DESTDIR)$(LIBDIR)/libq3.a $(DESTDIR)$(LIBDIR)/libq3.so \
	  $(DESTDIR)$(LIBDIR)/libq3.so.$(SOMAJOR) $(DESTDIR)$(LIBDIR)/libq3.so.$(VERSION) \
	  $(DESTDIR)$(INCDIR)/q3.h $(DESTDIR)$(PCDIR)/q3.pc \
	  $(DESTDIR)$(DATADIR)/qwen3-tokenizer/tokenizer.json $(DESTDIR)$(DATADIR)/qwen3-tokenizer/tokenizer_config.json
	@for d in $(DESTDIR)$(DATADIR)/qwen3-tokenizer $(DESTDIR)$(DATADIR) $(DESTDIR)$(PCDIR) $(DESTDIR)$(BINDIR) \
	  $(DESTDIR)$(LIBDIR) $(DESTDIR)$(INCDIR) $(dir $(DESTDIR)$(DATADIR)); do \
	  [ -d "$$d" ] && rmdir "$$d" 2>/dev/null || true; done

$(BUILD)/q3: $(CLI_OBJ) $(SERVER_OBJ) $(TOOLS_LIB) $(BUILD)/libq3.a
	$(CC) $(LDFLAGS) -o $@ $(CLI_OBJ) $(SERVER_OBJ) $(TOOLS_LIB) $(BUILD)/libq3.a $(SERVER_LIBS) $(LDLIBS)

$(BUILD)/tests/%: tests/%.c $(TOOLS_LIB) $(BUILD)/libq3.a $(SERVER_OBJ) tests/test.h $(FLAGS_STAMP)
	@mkdir -p $(@D)
	$(CC) $(BASE) $(WARN) $(CFLAGS) $(LDFLAGS) -Itests -o $@ $< $(SERVER_OBJ) $(TOOLS_LIB) $(BUILD)/libq3.a $(SERVER_LIBS) $(LDLIBS)

$(BUILD)/bench/%: bench/%.c $(TOOLS_LIB) $(BUILD)/libq3.a $(FLAGS_STAMP)
	@mkdir -p $(@D)
	$(CC) $(BASE) $(WARN) $(CFLAGS) $(LDFLAGS) -o $@ $< $(TOOLS_LIB) $(BUILD)/libq3.a $(LDLIBS)

$(BUILD)/%_avx512.o: %_avx512.c Makefile $(FLAGS_STAMP)
	@mkdir -p $(@D)
	$(CC) $(BASE) $(WARN) $(CFLAGS) $(AVX512_FLAGS) -c -o $@ $<

$(BUILD)/%_avx2.o: %_avx2.c Makefile $(FLAGS_STAMP)
	@mkdir -p $(@D)
	$(CC) $(BASE) $(WARN) $(CFLAGS) $(AVX2_FLAGS) -c -o $@ $<

# The server is a client of the library: it sees include/q3.h and its own
# folder, nothing of src/ (no -Isrc), so a non-public header cannot creep in.
$(BUILD)/src/server/%.o: src/server/%.c Makefile $(FLAGS_STAMP)
	@mkdir -p $(@D)
	$(CC) $(filter-out -Isrc -I.,$(BASE)) $(WARN) $(CFLAGS) -c -o $@ $<

# Objects depend on the Makefile and the flags stamp: a change of flags rebuilds them.
$(BUILD)/%.o: %.c Makefile $(FLAGS_STAMP)
	@mkdir -p $(@D)
	$(CC) $(BASE) $(WARN) $(CFLAGS) -c -o $@ $<

# TESTS="test_a test_b": only those (and q3, which they may run).
test: $(if $(TESTS),$(BUILD)/q3 $(TESTS:%=$(BUILD)/tests/%),all)
	@BUILD=$(BUILD) TESTS="$(TESTS)" sh tests/run.sh

# The layers: each #include and each call (nm on the objects) points to the
# same or a lower layer; src/cli and src/server use the public API (and the
# CLI tools/). See scripts/check-layers.sh.
check-layers: all
	@BUILD=$(BUILD) sh scripts/check-layers.sh
.PHONY: check-layers

# The parser, text and fuzz-regression tests under Valgrind's memcheck: leaks
# (definite and indirect) on the error paths and reads of uninitialised memory.
# Valgrind hides AVX-512 from the program, so these run the portable paths.
VALGRIND_TESTS := test_loader test_gguf test_tokenizer test_chat_template test_sampler test_fuzz_regressions
valgrind: all
	@fail=0; for t in $(VALGRIND_TESTS); do \
	  printf 'valgrind %-24s ' $$t; \
	  if valgrind -q --leak-check=full --errors-for-leak-kinds=definite,indirect --error-exitcode=99 \
	      $(BUILD)/tests/$$t >$(BUILD)/tests/$$t.valgrind.log 2>&1; then tail -1 $(BUILD)/tests/$$t.valgrind.log; \
	  else echo "FAILED (see $(BUILD)/tests/$$t.valgrind.log)"; grep -m20 '==[0-9]*==' $(BUILD)/tests/$$t.valgrind.log; fail=1; fi; \
	done; exit $$fail

deps:
	sh scripts/install-deps.sh
	sh scripts/fetch-tokenizer.sh
	cd tests/openai && npm ci --no-audit --no-fund --loglevel=error

clean:
	rm -rf build build-san build-tsan

.PHONY: all test valgrind deps clean install uninstall
-include $(shell find $(BUILD) -name '*.d' 2>/dev/null)

# ---- fuzzing ----
# libFuzzer targets (fuzz/fuzz_*.c), built with clang, ASan and UBSan into
# build-fuzz/ from the parser sources only (src/util, src/model, src/text,
# src/sample, the writers of tools/, and src/server but its HTTP layer and
# engine: no libmicrohttpd).
# `make fuzz-build` builds them; `make fuzz [FUZZ_SECONDS=60]` builds and runs
# each for FUZZ_SECONDS (scripts/fuzz.sh); `make fuzz-seeds` rewrites the binary
# seed files of fuzz/corpus/ (fuzz/make_seeds.c).
FUZZ_CC      ?= clang
FUZZ_BUILD   := build-fuzz
FUZZ_SECONDS ?= 60
FUZZ_CFLAGS  := -std=c17 -g -O1 -MMD -MP -Iinclude -Isrc -I. -D_GNU_SOURCE -fno-math-errno \
                -fno-omit-frame-pointer -fsanitize=address,undefined -fno-sanitize-recover=undefined
FUZZ_LIB_SRC := $(sort $(wildcard src/util/*.c src/model/*.c src/text/*.c src/sample/*.c src/grammar/*.c tools/*_write.c)) \
                $(filter-out src/server/http.c src/server/engine.c src/server/embed_api.c,$(sort $(wildcard src/server/*.c)))
FUZZ_LIB_OBJ := $(FUZZ_LIB_SRC:%.c=$(FUZZ_BUILD)/%.o)
FUZZ_BIN     := $(patsubst fuzz/%.c,$(FUZZ_BUILD)/%,$(sort $(wildcard fuzz/fuzz_*.c)))

$(FUZZ_BUILD)/src/%.o: src/%.c
	@mkdir -p $(@D)
	$(FUZZ_CC) $(FUZZ_CFLAGS) -fsanitize=fuzzer-no-link -c -o $@ $<

$(FUZZ_BUILD)/tools/%.o: tools/%.c
	@mkdir -p $(@D)
	$(FUZZ_CC) $(FUZZ_CFLAGS) -fsanitize=fuzzer-no-link -c -o $@ $<

$(FUZZ_BUILD)/libq3fuzz.a: $(FUZZ_LIB_OBJ)
	@rm -f $@
	ar rcs $@ $^

$(FUZZ_BUILD)/fuzz_%: fuzz/fuzz_%.c $(FUZZ_BUILD)/libq3fuzz.a
	$(FUZZ_CC) $(FUZZ_CFLAGS) -Ifuzz -fsanitize=fuzzer -o $@ $< $(FUZZ_BUILD)/libq3fuzz.a $(LDLIBS)

$(FUZZ_BUILD)/make_seeds: fuzz/make_seeds.c $(FUZZ_BUILD)/libq3fuzz.a
	$(FUZZ_CC) $(FUZZ_CFLAGS) -Ifuzz -o $@ $< $(FUZZ_BUILD)/libq3fuzz.a $(LDLIBS)

fuzz-build: $(FUZZ_BIN)

fuzz: fuzz-build
	sh scripts/fuzz.sh $(FUZZ_SECONDS)

fuzz-seeds: $(FUZZ_BUILD)/make_seeds
	$(FUZZ_BUILD)/make_seeds fuzz/corpus

.PHONY: fuzz fuzz-build fuzz-seeds
-include $(shell find $(FUZZ_BUILD) -name '*.d' 2>/dev/null)
