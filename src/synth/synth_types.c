/* synth_types.c — flm_synth_type_ok (include/flashlm_tools.h): the tensor types synth can write. */
#include "core/types.h"
#include "flashlm_tools.h"

bool flm_synth_type_ok(uint32_t type) {
    const flm_type_traits *tt = flm_type_traits_of(type); /* NULL for an unknown id */
    return tt && tt->is_tensor && tt->has_quantizer;
}
