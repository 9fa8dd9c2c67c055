/* Downloads a model from a Hugging Face hub into the cache layout hf_cache.h reads (the one
 * huggingface_hub writes, so either tool finds what the other fetched):
 *   GET ENDPOINT/api/models/ORG/NAME/revision/REV?blobs=true   the commit, files, sizes, hashes
 *   GET ENDPOINT/ORG/NAME/resolve/COMMIT/FILE                   each file (often a redirect)
 * into blobs/HASH (through blobs/HASH.incomplete, resumed with a Range request after a cut
 * connection or an interrupted run), checked against the hub's SHA-256 (LFS files) or git
 * blob SHA-1 (small files) before it is renamed into place; snapshots/COMMIT/FILE link to the
 * blobs; refs/REV names the commit once every file is there. ENDPOINT is $HF_ENDPOINT, else
 * https://huggingface.co; the token $HF_TOKEN, else the file huggingface-cli login writes
 * ($HF_TOKEN_PATH, else $HF_HOME/token, else ~/.cache/huggingface/token). */
#ifndef LMHOST_HUB_DOWNLOAD_H
#define LMHOST_HUB_DOWNLOAD_H

#include <stddef.h>

typedef struct {
    char *path;     /* relative to the repository's root */
    long long size; /* bytes */
    char hash[65];  /* lowercase hex: the LFS SHA-256, else the git blob SHA-1 */
    int lfs;        /* 1: hash is a SHA-256 of the content */
} hub_file;

typedef struct {
    char commit[41];
    hub_file *files;
    int n;
} hub_info;

/* Parses the hub's answer to /api/models/ORG/NAME/revision/REV?blobs=true: the commit
 * ("sha") and each sibling's rfilename, size, blobId and lfs.sha256. A file whose path could
 * leave the snapshot folder (absolute, "..", backslashes, control characters) or whose hash
 * is not hex of the right length makes it malformed. 0, or -1 with err. */
int hub_parse_info(const char *json, size_t len, hub_info *info, char *err, size_t err_len);
void hub_info_free(hub_info *info);

/* Whether lmhost reads a file of this path (top-level configs, weights, tokenizer files and
 * chat templates): what a pull fetches unless told to fetch everything. */
int hub_wanted(const char *path);

/* 1 when $HF_HUB_OFFLINE asks for no network access. */
int hub_offline(void);

typedef struct {
    int all_files; /* every file of the repository, not only hub_wanted ones */
    int quiet;     /* no progress bars */
} hub_pull_opts;

/* Fetches ORG/NAME[@REVISION] (what it lacks of it) into the cache; the snapshot directory
 * into dir. 0, or -1 with err saying what failed (not found, a token needed, a network
 * error after retries, a file whose hash does not match: its partial file is removed). */
int hub_pull(const char *name, const hub_pull_opts *o, char *dir, size_t dir_cap, char *err,
             size_t err_len);

#endif
