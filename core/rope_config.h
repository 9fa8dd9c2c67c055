/* Rotary-embedding settings from config.json, in both the legacy form (rope_theta,
 * rope_scaling, rope_local_base_freq) and the transformers 5 form (rope_parameters,
 * possibly keyed by layer type). */
#ifndef LMHOST_ROPE_CONFIG_H
#define LMHOST_ROPE_CONFIG_H

#include <json-c/json.h>
#include "lmhost/abi.h"

/* Writes rot_dims/2 inverse frequencies for layers of `layer_type` (NULL: model-wide).
 * Supported rope types: default, linear, llama3, yarn, proportional. "proportional" takes
 * rot_dims as the whole head and reads partial_rotary_factor itself: pairs past that
 * fraction get frequency 0, so they pass through a rope over the whole head unchanged.
 * The other types ignore partial_rotary_factor (the caller passes the rotated width). */
int rope_compute(json_object *config, const char *layer_type, int32_t rot_dims, float *inv_freq,
                 lmh_rope_info *info, char *err, size_t err_len);

#endif
