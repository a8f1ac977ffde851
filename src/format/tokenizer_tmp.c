/* TEMPORARY until the tokenizer branch lands: add_bos as before. */
#include "format/tokenizer.h"
bool flm_tokenizer_wants_bos(const flm_tokenizer *t) { (void)t; return true; }
