/* Finding and opening plugins with libltdl, and the registry of those accepted. */
#ifndef LMHOST_PLUGIN_LOADER_H
#define LMHOST_PLUGIN_LOADER_H

#include "lmhost/lmhost.h"

typedef struct plugin {
    const lmh_plugin_info *info;
    char *file; /* path it was loaded from */
} plugin;

typedef struct registry {
    plugin *items;
    int n, cap;
    /* Files refused, with why, for `lmhost plugins`. */
    char **refused;
    int n_refused;
} registry;

/* Scans, in this order (first of a kind+name wins): extra_dir (--plugin-dir), each entry
 * of $LMHOST_PLUGIN_PATH (':'-separated), the build tree, the install prefix. Plugin
 * files are named lmhost-*.so. Refused plugins are logged with the reason and skipped. */
int registry_load(registry *r, const char *extra_dir);
/* The same with one plugin file loaded before everything else (so it wins its name and,
 * for an architecture, the model types it claims); refused like any other. */
int registry_load_with(registry *r, const char *first_file, const char *extra_dir);
void registry_free(registry *r);

/* The plugin of this kind and name, or NULL. */
const plugin *registry_find(const registry *r, lmh_plugin_kind kind, const char *name);
/* The architecture plugin claiming model_type, or NULL. */
const plugin *registry_find_arch(const registry *r, const char *model_type);
/* Comma-separated names of a kind (or the model types the architectures claim), malloc'd. */
char *registry_names(const registry *r, lmh_plugin_kind kind, int model_types);

/* Starts an instance of the backend plugin that spec names: "NAME", or "NAME:OPTIONS" with
 * the plugin's options (`--backend vulkan:max-memory=4G`), handed to it as
 * lmh_backend_opts.params (plugin ABI 1.12) beside o's other settings. *p gets the plugin
 * (p may be NULL). Nonzero with err saying why: an unknown plugin (naming those there are),
 * options for a plugin built before 1.12, or create's own message. */
int registry_backend_start(const registry *r, const char *spec, const lmh_backend_opts *o,
                           const plugin **p, lmh_backend **b, char *err, size_t err_len);

/* The host services table handed to plugins (engine.c fills the load/forward parts). */
extern const lmh_host_api host_api;

#endif
