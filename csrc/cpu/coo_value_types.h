/* Instantiates coo_impl.h for every value type (float32, float64, float16, bfloat16)
   with the index type the includer defined as ISFX / IT. Half types load into and
   accumulate in float32 and are rounded once when stored. */
#define VSFX f32
#define VT float
#define ACC float
#define LOAD(v) (v)
#define STORE(a) (a)
#include "coo_impl.h"
#undef VSFX
#undef VT
#undef ACC
#undef LOAD
#undef STORE
#define VSFX f64
#define VT double
#define ACC double
#define LOAD(v) (v)
#define STORE(a) (a)
#include "coo_impl.h"
#undef VSFX
#undef VT
#undef ACC
#undef LOAD
#undef STORE
#define VSFX f16
#define VT uint16_t
#define ACC float
#define LOAD(v) ld_f16(v)
#define STORE(a) st_f16(a)
#include "coo_impl.h"
#undef VSFX
#undef VT
#undef ACC
#undef LOAD
#undef STORE
#define VSFX bf16
#define VT uint16_t
#define ACC float
#define LOAD(v) ld_bf16(v)
#define STORE(a) st_bf16(a)
#include "coo_impl.h"
#undef VSFX
#undef VT
#undef ACC
#undef LOAD
#undef STORE
