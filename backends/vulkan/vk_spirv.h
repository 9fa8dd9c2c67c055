/* What a SPIR-V compute shader asks of a device: its workgroup size and the bytes of its
 * shared (Workgroup) variables, read from the module itself. A plugin's kernel that asks
 * for more than the device gives is refused with a message, instead of being handed to a
 * driver whose limits it breaks (undefined behaviour in Vulkan). */
#ifndef LMHOST_VULKAN_SPIRV_H
#define LMHOST_VULKAN_SPIRV_H

#include <stddef.h>
#include <stdint.h>

typedef struct vk_spirv_needs {
    uint32_t local[3];     /* workgroup size; all 0 where the module gives none */
    uint64_t shared_bytes; /* its Workgroup variables, naturally aligned: at least this */
    int shared_known;      /* 0: a size the reader cannot evaluate (shared_bytes is a floor) */
} vk_spirv_needs;

/* Reads a module of `bytes` bytes (words in host order, as Vulkan takes them). 0, or -1
 * with err saying what is malformed. Never reads past the module. */
int vk_spirv_read(const uint32_t *code, size_t bytes, vk_spirv_needs *out, char *err,
                  size_t err_len);

#endif
