/* tests/fuzz/fuzz_replay.h - the replay main() shared by the fuzz targets. Included last by each
 * tests/fuzz/fuzz_*.c after it defines LLVMFuzzerTestOneInput. Built with -DTM_LIBFUZZER (the
 * libFuzzer binaries, whose main() is libFuzzer's) it adds nothing; otherwise it adds a main()
 * that runs every file named on the command line through the target once, so that every build
 * (ctest <name>_corpus, label unit) replays the committed corpus and its regression seeds. Files
 * over FUZZ_REPLAY_MAX bytes are an error: the corpora hold small files only. */
#ifndef TM_TESTS_FUZZ_REPLAY_H
#define TM_TESTS_FUZZ_REPLAY_H

#ifndef TM_LIBFUZZER
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define FUZZ_REPLAY_MAX (4u << 20)

int main(int argc, char **argv) {
    uint8_t *buf = malloc(FUZZ_REPLAY_MAX + 1);
    if (!buf)
        return 1;
    for (int i = 1; i < argc; i++) {
        FILE *f = fopen(argv[i], "rb");
        if (!f) {
            perror(argv[i]);
            free(buf);
            return 1;
        }
        size_t n = fread(buf, 1, FUZZ_REPLAY_MAX + 1, f);
        fclose(f);
        if (n > FUZZ_REPLAY_MAX) {
            fprintf(stderr, "%s: over %u bytes\n", argv[i], FUZZ_REPLAY_MAX);
            free(buf);
            return 1;
        }
        // an exact-size copy, so that ASan sees reads past the end of the input
        uint8_t *in = malloc(n ? n : 1);
        if (!in) {
            free(buf);
            return 1;
        }
        memcpy(in, buf, n);
        LLVMFuzzerTestOneInput(in, n);
        free(in);
    }
    free(buf);
    printf("%s: %d inputs replayed, no invariant broken\n", argv[0], argc - 1);
    return 0;
}
#endif /* TM_LIBFUZZER */

#endif /* TM_TESTS_FUZZ_REPLAY_H */
