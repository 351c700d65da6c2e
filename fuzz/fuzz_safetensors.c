/* fuzz_safetensors.c - libFuzzer entry: any byte string given to the
 * safetensors parser must yield either a valid tensor list whose views lie
 * inside the buffer, or an error; never a crash, leak or out-of-bounds read. */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "format/safetensors.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    mx_tensor *ts = NULL;
    size_t n = 0;
    mx_err e;
    if (mx_st_parse(data, size, "fuzz.safetensors", &ts, &n, &e) == 0) {
        for (size_t i = 0; i < n; i++) {
            const uint8_t *p = ts[i].data;
            /* Every view must lie inside the input; touching its bytes lets
             * ASan catch any that does not. */
            if (p < data || ts[i].nbytes > size || p + ts[i].nbytes > data + size)
                abort();
            if ((uint64_t)mx_tensor_numel(&ts[i]) * mx_dtype_size(ts[i].dtype) != ts[i].nbytes)
                abort();
            volatile uint8_t sink = 0;
            if (ts[i].nbytes)
                sink ^= p[0] ^ p[ts[i].nbytes - 1];
            (void)sink;
        }
        mx_st_free_tensors(ts, n);
    } else if (ts || n || !e.msg[0]) {
        abort();   /* errors must clear the outputs and say why */
    }
    return 0;
}
