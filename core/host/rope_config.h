/* Rotary-embedding settings from config.json, in both the legacy form (rope_theta,
 * rope_scaling, rope_local_base_freq) and the transformers 5 form (rope_parameters,
 * possibly keyed by layer type). */
#ifndef LMHOST_ROPE_CONFIG_H
#define LMHOST_ROPE_CONFIG_H

#include <json-c/json.h>
#include "lmhost/abi.h"

/* Writes rot_dims/2 inverse frequencies for layers of `layer_type` (NULL: model-wide).
 * Rope types the host computes: default, linear, yarn, proportional (others are left to
 * the architecture plugins, through rope_setting/rope_type_name). "proportional" takes
 * rot_dims as the whole head and reads partial_rotary_factor itself: pairs past that
 * fraction get frequency 0, so they pass through a rope over the whole head unchanged.
 * The other types ignore partial_rotary_factor (the caller passes the rotated width). */
int rope_compute(json_object *config, const char *layer_type, int32_t rot_dims, float *inv_freq,
                 lmh_rope_info *info, char *err, size_t err_len);

/* A number from the rope settings of `layer_type` ("rope_theta" always resolves). Returns
 * 0, 1 when absent, -1 on a bad value (err set). */
int rope_setting(json_object *config, const char *layer_type, const char *key, double *out,
                 char *err, size_t err_len);
/* The rope_type in force for `layer_type` ("default" when none), NULL on a bad config. */
const char *rope_type_name(json_object *config, const char *layer_type);

#endif
