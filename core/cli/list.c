/* lmhost list: the models in the Hugging Face cache, which --model takes by name. */
#include "cli.h"
#include "hf_cache.h"

#include <stdio.h>

static void row(void *ctx, const char *name, const char *commit, const char *dir, int complete,
                unsigned long long bytes) {
    (void)ctx;
    printf("%-48s %-12.12s %9.1f MiB  %-10s %s\n", name, commit, (double)bytes / (1 << 20),
           complete ? "ready" : "incomplete", dir);
}

int cli_list(int argc, char **argv) {
    char cache[2048], notes[2560];
    hfc_cache_dir(cache, sizeof cache);
    snprintf(notes, sizeof notes,
             "The models in the Hugging Face cache (now %s: $HF_HUB_CACHE, else\n"
             "$HF_HOME/hub, else ~/.cache/huggingface/hub): name, the commit main points\n"
             "at, bytes, whether it holds a config.json, and its snapshot directory.",
             cache);
    cli_opt opts[] = {{.help = notes}}; /* no options; --help is cli_parse's */
    if (cli_parse(argc, argv, opts)) return 2;
    printf("%-48s %-12s %13s  %-10s %s\n", "MODEL", "COMMIT", "SIZE", "STATE", "DIRECTORY");
    if (hfc_list(row, NULL) == 0) fprintf(stderr, "lmhost list: no models in %s\n", cache);
    return 0;
}
