/* lmhost pull: download a model from the Hugging Face hub into the cache, without loading it. */
#include "cli.h"
#include "hf_cache.h"
#include "hub_download.h"

#include <stdio.h>
#include <string.h>

int cli_pull(int argc, char **argv) {
    const char *model = NULL;
    int all = 0, quiet = 0;
    /* the name may come first, as in `lmhost pull ORG/NAME` */
    if (argc > 1 && argv[1][0] != '-') {
        model = argv[1];
        argv[1] = argv[0];
        argc--, argv++;
    }
    char cache[2048], notes[2600];
    hfc_cache_dir(cache, sizeof cache);
    snprintf(notes, sizeof notes,
             "Downloads what the cache (now %s) lacks of a model:\n"
             "its configs, weights, tokenizer and chat template files, or --all of them.\n"
             "The hub is $HF_ENDPOINT (default https://huggingface.co); a gated or\n"
             "private model needs $HF_TOKEN (or huggingface-cli login's token file). An\n"
             "interrupted pull resumes where it stopped; every file is checked against\n"
             "the hub's SHA-256 or git hash. Prints the snapshot directory.",
             cache);
    const char *m2 = NULL;
    cli_opt opts[] = {
        {"--model", &m2, .arg = "ORG/NAME[@REV]", .def = "the first argument",
         .help = "the model to fetch (a revision: a branch, tag or commit)"},
        {"--all", .flag = &all, .def = "off",
         .help = "every file of the repository, not only those lmhost reads"},
        {"--quiet", .flag = &quiet, .def = "off", .help = "no progress bars"},
        {.help = notes},
    };
    if (cli_parse(argc, argv, opts)) return 2;
    if (m2) model = m2;
    char org[97], nm[97], rev[129];
    if (!model || !hfc_split(model, org, nm, rev)) {
        fprintf(stderr, "lmhost pull: give a model name ORG/NAME[@REVISION]%s%s\n",
                model ? ", not " : "", model ? model : "");
        return 2;
    }
    char dir[4096], err[4096];
    hub_pull_opts o = {.all_files = all, .quiet = quiet};
    if (hub_pull(model, &o, dir, sizeof dir, err, sizeof err)) {
        fprintf(stderr, "lmhost pull: %s\n", err);
        return 1;
    }
    printf("%s\n", dir);
    return 0;
}
