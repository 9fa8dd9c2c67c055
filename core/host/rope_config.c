#include "rope_config.h"
#include "log.h"
#include "model_dir.h"

#include <math.h>
#include <string.h>

static int num(json_object *o, const char *key, double *out) {
    json_object *v = o ? cfg_lookup(o, key) : NULL;
    if (!v) return 0;
    if (!json_object_is_type(v, json_type_int) && !json_object_is_type(v, json_type_double))
        return -1;
    *out = json_object_get_double(v);
    return 1;
}

/* Reads `key` of `o` into *out when present; a non-number is an error. */
#define GETNUM(o, key, out)                                                                        \
    do {                                                                                           \
        if (num((o), (key), (out)) < 0)                                                            \
            return errf(err, err_len, "config.json: rope setting '%s' is not a number", key);      \
    } while (0)

static double yarn_mscale(double scale, double m) {
    return scale <= 1.0 ? 1.0 : 0.1 * m * log(scale) + 1.0;
}

/* Where the rope settings for `layer_type` sit: rope_parameters (possibly keyed by layer
 * type), else the legacy top-level rope_theta with rope_scaling. */
typedef struct rope_src {
    json_object *scaling; /* the object holding rope_type, factor, ...; NULL: none */
    double theta;
    const char *type;
} rope_src;

static int rope_find(json_object *cfg, const char *layer_type, rope_src *r, char *err,
                     size_t err_len) {
    r->scaling = NULL;
    r->theta = 10000.0;
    r->type = "default";
    json_object *rp = cfg_lookup(cfg, "rope_parameters");
    if (rp && json_object_is_type(rp, json_type_object)) {
        json_object *per = layer_type ? cfg_lookup(rp, layer_type) : NULL;
        if (!per && !cfg_lookup(rp, "rope_theta") && !cfg_lookup(rp, "rope_type")) {
            /* keyed by layer type but no type asked for: take full attention's */
            per = cfg_lookup(rp, "full_attention");
        }
        r->scaling = per && json_object_is_type(per, json_type_object) ? per : rp;
        GETNUM(r->scaling, "rope_theta", &r->theta);
    } else {
        GETNUM(cfg, "rope_theta", &r->theta);
        r->scaling = cfg_lookup(cfg, "rope_scaling");
        if (r->scaling && !json_object_is_type(r->scaling, json_type_object))
            return errf(err, err_len, "config.json: rope_scaling must be an object or null");
        /* Legacy local/global configs: local layers use rope_local_base_freq, unscaled. */
        if (layer_type && strcmp(layer_type, "sliding_attention") == 0 &&
            cfg_lookup(cfg, "rope_local_base_freq")) {
            GETNUM(cfg, "rope_local_base_freq", &r->theta);
            r->scaling = NULL;
        }
    }
    if (!(r->theta > 0) || !isfinite(r->theta))
        return errf(err, err_len, "config.json: rope_theta must be positive (got %g)", r->theta);
    if (r->scaling) {
        json_object *t = cfg_lookup(r->scaling, "rope_type");
        if (!t) t = cfg_lookup(r->scaling, "type");
        if (t) {
            if (!json_object_is_type(t, json_type_string))
                return errf(err, err_len, "config.json: rope_type must be a string");
            r->type = json_object_get_string(t);
        }
    }
    return 0;
}

int rope_setting(json_object *cfg, const char *layer_type, const char *key, double *out, char *err,
                 size_t err_len) {
    rope_src r;
    if (rope_find(cfg, layer_type, &r, err, err_len)) return -1;
    if (strcmp(key, "rope_theta") == 0) {
        *out = r.theta;
        return 0;
    }
    int rc = num(r.scaling, key, out);
    if (rc < 0) return errf(err, err_len, "config.json: rope setting '%s' is not a number", key);
    return rc ? 0 : 1; /* 1: absent */
}

const char *rope_type_name(json_object *cfg, const char *layer_type) {
    rope_src r;
    char err[256];
    return rope_find(cfg, layer_type, &r, err, sizeof err) ? NULL : r.type;
}

int rope_compute(json_object *cfg, const char *layer_type, int32_t rot_dims, float *inv_freq,
                 lmh_rope_info *info, char *err, size_t err_len) {
    if (rot_dims <= 0 || rot_dims % 2)
        return errf(err, err_len, "rotary dimension %d must be positive and even", rot_dims);
    rope_src r;
    if (rope_find(cfg, layer_type, &r, err, err_len)) return -1;
    json_object *scaling = r.scaling;
    const double theta = r.theta;
    const char *type = r.type;
    int32_t half = rot_dims / 2;
    for (int32_t i = 0; i < half; i++)
        inv_freq[i] = (float)(1.0 / pow(theta, (double)(2 * i) / (double)rot_dims));
    info->attn_factor = 1.0f;
    info->n_pairs = half;

    double factor = 1.0;
    GETNUM(scaling, "factor", &factor);
    if (strcmp(type, "default") == 0) return 0;
    if (!(factor > 0))
        return errf(err, err_len, "config.json: rope scaling factor must be positive (got %g)",
                    factor);
    if (strcmp(type, "linear") == 0) {
        for (int32_t i = 0; i < half; i++) inv_freq[i] = (float)(inv_freq[i] / factor);
        return 0;
    }
    if (strcmp(type, "proportional") == 0) {
        /* rot_dims is the whole head: the first partial_rotary_factor of its pairs rotate
         * with exponents over the whole width, the rest get frequency 0 (pass through). */
        double prf = 1.0;
        GETNUM(scaling, "partial_rotary_factor", &prf);
        if (!(prf > 0 && prf <= 1))
            return errf(err, err_len,
                        "config.json: partial_rotary_factor must be in (0, 1] (got %g)", prf);
        int32_t angles = (int32_t)floor(prf * rot_dims / 2.0);
        for (int32_t i = 0; i < half; i++)
            inv_freq[i] = i < angles ? (float)(inv_freq[i] / factor) : 0.0f;
        return 0;
    }
    double orig = 0;
    GETNUM(scaling, "original_max_position_embeddings", &orig);
    if (strcmp(type, "yarn") == 0) {
        double beta_fast = 32, beta_slow = 1, mscale = 0, mscale_all = 0, attn = 0;
        GETNUM(scaling, "beta_fast", &beta_fast);
        GETNUM(scaling, "beta_slow", &beta_slow);
        GETNUM(scaling, "mscale", &mscale);
        GETNUM(scaling, "mscale_all_dim", &mscale_all);
        GETNUM(scaling, "attention_factor", &attn);
        if (!(orig > 0)) GETNUM(cfg, "max_position_embeddings", &orig);
        if (!(orig > 0))
            return errf(err, err_len,
                        "config.json: yarn rope needs original_max_position_embeddings");
        if (attn <= 0)
            attn = (mscale > 0 && mscale_all > 0)
                       ? yarn_mscale(factor, mscale) / yarn_mscale(factor, mscale_all)
                       : yarn_mscale(factor, 1.0);
        double d = rot_dims, base = theta;
        double lo = floor(d * log(orig / (beta_fast * 2 * M_PI)) / (2 * log(base)));
        double hi = ceil(d * log(orig / (beta_slow * 2 * M_PI)) / (2 * log(base)));
        int truncate = 1;
        json_object *tr = cfg_lookup(scaling, "truncate");
        if (tr && json_object_is_type(tr, json_type_boolean))
            truncate = json_object_get_boolean(tr);
        if (!truncate) {
            lo = d * log(orig / (beta_fast * 2 * M_PI)) / (2 * log(base));
            hi = d * log(orig / (beta_slow * 2 * M_PI)) / (2 * log(base));
        }
        if (lo < 0) lo = 0;
        if (hi > d - 1) hi = d - 1;
        if (lo == hi) hi += 0.001;
        for (int32_t i = 0; i < half; i++) {
            double extrap = inv_freq[i], interp = inv_freq[i] / factor;
            double ramp = ((double)i - lo) / (hi - lo);
            ramp = ramp < 0 ? 0 : ramp > 1 ? 1 : ramp;
            double ef = 1.0 - ramp;
            inv_freq[i] = (float)(interp * (1.0 - ef) + extrap * ef);
        }
        info->attn_factor = (float)attn;
        return 0;
    }
    return errf(err, err_len,
                "config.json: rope_type '%s' is not one the host computes (default, linear, "
                "yarn, proportional), and the architecture plugin did not handle it",
                type);
}
