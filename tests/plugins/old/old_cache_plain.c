/* cache-plain as a cache plugin built against ABI 1.9 would present itself: the same code,
 * its info saying minor 9. The host must then refuse a model with attention sinks (1.10)
 * on it, naming it, rather than let it drop them; models without sinks still run. */
#define lmhost_plugin_entry plain_entry_1_10
#include "../../../plugins/cache-plain/cache_plain.c"
#undef lmhost_plugin_entry

LMH_EXPORT const lmh_plugin_info *lmhost_plugin_entry(void) {
    static lmh_plugin_info old;
    old = *plain_entry_1_10();
    old.abi_minor = 9;
    return &old;
}
