// convert/json.h: the JSON parser moved to the top level (../json.h), shared by the converter and the server. This
// forward stays only while tests/test_gpu.c includes it by its old path.
#include "../json.h"
