/* A Hugging Face model directory: config.json plus one safetensors file or a sharded set
 * named by model.safetensors.index.json. Weights stay memory-mapped. */
#ifndef LMHOST_MODEL_DIR_H
#define LMHOST_MODEL_DIR_H

#include <json-c/json.h>
#include "safetensors.h"

typedef struct model_dir model_dir;

/* Opens DIR: parses config.json (must be a JSON object) and maps the weights
 * (model.safetensors, or every shard listed in model.safetensors.index.json, checking that
 * each tensor the index names is in the shard it names; a directory with neither is an
 * error; a bare *.safetensors set without index is accepted when there is exactly one
 * file). NULL with err set on failure. */
model_dir *md_open(const char *dir, char *err, size_t err_len);
void md_close(model_dir *md);

const char *md_path(const model_dir *md);
json_object *md_config(const model_dir *md);
/* The tensor by checkpoint name, NULL if absent. */
const st_tensor *md_find(const model_dir *md, const char *name);
int32_t md_count(const model_dir *md);
const st_tensor *md_at(const model_dir *md, int32_t i);
/* The file holding t's bytes and where they start in it (for reading them without the
 * mapping, as streamed experts are). -1 for a tensor not in md's files. */
int md_locate(const model_dir *md, const st_tensor *t, const char **path, uint64_t *offset);
/* Total bytes of all tensors. */
uint64_t md_weight_bytes(const model_dir *md);

/* Parses config.json text (strict JSON; it must be an object, only whitespace may follow).
 * NULL with err set on failure. Pure: the fuzz target calls it directly. */
json_object *md_parse_config(const char *text, size_t len, char *err, size_t err_len);

/* config lookups by dotted path ("rope_parameters.rope_theta", "layer_types.3").
 * NULL when absent or JSON null. */
json_object *cfg_lookup(json_object *root, const char *path);

/* Pooling of a sentence-transformers layout (what its Pooling module does with the final
 * hidden states). */
enum { MD_POOL_NONE = 0, MD_POOL_MEAN, MD_POOL_LAST, MD_POOL_CLS };

/* The pooling DIR's sentence-transformers files ask for: the config.json in the folder of
 * modules.json's Pooling module, or 1_Pooling/config.json where there is no modules.json.
 * That config must turn on exactly one of pooling_mode_mean_tokens, pooling_mode_lasttoken
 * and pooling_mode_cls_token (true/false values). *pooling is MD_POOL_NONE where DIR has
 * neither file (or modules.json lists no Pooling module); *dim its word_embedding_dimension,
 * 0 where not given. Returns 0, or -1 with err naming the file and what is wrong with it
 * (also a module the host does not run, such as Dense, after the pooling). */
int md_read_pooling(const char *dir, int *pooling, int64_t *dim, char *err, size_t err_len);

#endif
