/* Models by Hugging Face name: ORG/NAME[@REVISION] found in the hub's cache layout, the one
 * huggingface_hub (huggingface-cli, transformers) writes, so models fetched with those tools
 * are used as they are:
 *   CACHE/models--ORG--NAME/refs/REVISION          the commit a branch or tag points at
 *   CACHE/models--ORG--NAME/snapshots/COMMIT/...   the files (links into blobs/)
 * CACHE is $HF_HUB_CACHE, else $HF_HOME/hub, else ~/.cache/huggingface/hub. */
#ifndef LMHOST_HF_CACHE_H
#define LMHOST_HF_CACHE_H

#include <stddef.h>

/* 1 when s reads as a hub name (ORG/NAME with an optional @REVISION, names of letters,
 * digits, '-', '_' and '.', no "..") and is not an existing path; 0 otherwise. */
int hfc_is_name(const char *s);

/* Splits "ORG/NAME[@REVISION]" (REVISION "main" when absent) into org[97], name[97], rev[129];
 * 1, or 0 when s is not of that form. */
int hfc_split(const char *s, char *org, char *name, char *rev);

/* 1 when r is 40 lowercase hex digits (a commit). */
int hfc_is_commit(const char *r);

/* The cache directory in use (see above) into out. */
void hfc_cache_dir(char *out, size_t cap);

/* The snapshot directory of name (hfc_is_name) in the cache, into out: 0, or -1 with err
 * saying what is missing (not cached, the revision unknown, no config.json). */
int hfc_resolve(const char *name, char *out, size_t cap, char *err, size_t err_len);

/* Each cached model: calls fn with its name (ORG/NAME), the commit main points at (or the
 * newest snapshot's), its snapshot directory, whether that holds config.json, and the bytes
 * its blobs take. Returns the number of models. */
typedef void (*hfc_list_fn)(void *ctx, const char *name, const char *commit, const char *dir,
                            int complete, unsigned long long bytes);
int hfc_list(hfc_list_fn fn, void *ctx);

#endif
