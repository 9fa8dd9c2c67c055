/* The tool-call plugins (plugins/toolcall-*) linked into a fuzz target, their sources built
 * with -DTCC_STATIC (each entry point is then tcc_entry_NAME; see run_fuzzers.sh), as a
 * registry of their own, and every format they read, none first. */
#ifndef LMHOST_FUZZ_TOOLCALL_STATIC_H
#define LMHOST_FUZZ_TOOLCALL_STATIC_H

#include "toolcall.h"

const lmh_plugin_info *tcc_entry_deepseek(void);
const lmh_plugin_info *tcc_entry_harmony(void);
const lmh_plugin_info *tcc_entry_hermes(void);
const lmh_plugin_info *tcc_entry_llama3(void);
const lmh_plugin_info *tcc_entry_mistral(void);

#define TC_STATIC_MAX_FORMATS 16

static registry tc_static_reg;
static tc_format tc_static_formats[TC_STATIC_MAX_FORMATS];
static int tc_static_n_formats;

static const registry *tc_static_registry(void) {
    static plugin items[5];
    if (!tc_static_reg.n) {
        const lmh_plugin_info *(*const entries[])(void) = {tcc_entry_deepseek, tcc_entry_harmony,
                                                           tcc_entry_hermes, tcc_entry_llama3,
                                                           tcc_entry_mistral};
        tc_static_n_formats = 1; /* none */
        for (int i = 0; i < 5; i++) {
            items[i] = (plugin){entries[i](), (char *)"linked in"};
            const lmh_toolcall_api *a = items[i].info->api;
            for (int k = 0; a->formats[k] && tc_static_n_formats < TC_STATIC_MAX_FORMATS; k++)
                tc_static_formats[tc_static_n_formats++] = (tc_format){a, k};
        }
        tc_static_reg = (registry){.items = items, .n = 5, .cap = 5};
    }
    return &tc_static_reg;
}

#endif
