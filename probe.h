// probe.h: looking inside a forward pass and steering it. After chosen layers, every row's residual stream (the
// hidden state the next layer reads) is added a control vector (--steer) and/or written to an activation dump
// (--dump-act). Both engines call in here after their layers: cpu.c's layer loop, and gpu.c's through probe_gpu.c,
// which keeps the vectors on the device.
//
// ---- the activation dump (little-endian), written as its rows are computed (fileio.h: PATH.tmp, renamed when the
// run completes):
//   [0, 256)   header: char magic[8] "DJINNACT", u32 version (1), u32 header_size (256), u32 dim, u32 n_layers
//              (the model's), u64 n_records, u64 record_bytes (16 + 4 dim), u32 n_dumped (layers listed), zero
//              padding to 64; then at 64 a bitmask of the layers dumped (128 bytes: layer l is bit l % 8 of byte
//              l / 8), then zero padding
//   then       n_records records of record_bytes: u32 layer, u32 pos, i32 token, u32 slot, then dim f32: the
//              residual stream of that row after that layer, steering (at that layer) included
// Records come in the order they are computed: pass by pass (a prompt's chunks, then each decode step), in a pass
// layer by layer, in a layer its rows; tools/read_act.py sorts them into (position, layer, dim) arrays.
// ---- a control vector: exactly dim f32 values, little-endian, nothing else (tools/make_cvector.py writes one).
// ---- a tap (the server's breakpoints, batch.h): the rows of one KV slot's positions [pos0, pos0 + n) after one
// layer, copied out (a breakpoint) or written over (a resume) wherever they pass, whatever else shares the pass:
// rows of other slots or positions are never touched. After the layer's vector, before its dump.
#ifndef DJINN_PROBE_H
#define DJINN_PROBE_H

#include <stdint.h>

#include "fileio.h"
#include "model.h"

#define PROBE_MAGIC "DJINNACT"
#define PROBE_VERSION 1u
#define PROBE_HEADER 256u

typedef struct dj_probe dj_probe;

// A layer list: "all", or layer numbers separated by commas ("0,15,31"). n_layers 0 checks the syntax only; else
// every layer must be below n_layers and mask (n_layers) gets a 1 for each listed one.
int probe_parse_layers(const char *spec, uint32_t n_layers, uint8_t *mask, dj_err *e);
// "LAYER:FILE[:SCALE]" (SCALE 1 when absent; FILE may hold ':' itself): the syntax, without reading FILE. *file is
// malloc'd. n_layers as for probe_parse_layers.
int probe_parse_steer(const char *spec, uint32_t n_layers, uint32_t *layer, char **file, double *scale, dj_err *e);

dj_probe *probe_new(const dj_config *c, dj_err *e);
// Removes an unfinished dump (its PATH.tmp) and frees; NULL is fine.
void probe_free(dj_probe *p);
// --steer: reads FILE's vector and adds it, times SCALE, after LAYER (vectors of one layer add up).
int probe_add_steer(dj_probe *p, const char *spec, dj_err *e);
// The same with a vector in memory (dim floats).
int probe_add_vector(dj_probe *p, uint32_t layer, const float *v, double scale, dj_err *e);
// --dump-act: the layers of `layers` into `out` (opened by the caller with out_open; the probe takes it over).
int probe_open_dump(dj_probe *p, const char *layers, dj_out *out, dj_err *e);
// Writes what is buffered and the header's record count, and renames the dump into place (nothing to do without
// one). After an error in probe_rows/probe_record, returns that error.
int probe_finish(dj_probe *p, dj_err *e);

// Taps a slot (at most one tap a slot): rows (n, dim), row i the residual stream of position pos0 + i after
// `layer`, filled (replace 0) or written into the stream (replace 1); the caller keeps rows alive until probe_untap.
int probe_tap(dj_probe *p, int32_t slot, uint32_t layer, int64_t pos0, int64_t n, int replace, float *rows, dj_err *e);
// The slot's tap removed; returns how many of its rows passed (each counted once however often it passed), 0
// without a tap.
int64_t probe_untap(dj_probe *p, int32_t slot);

// ---- for the engines
uint32_t probe_dim(const dj_probe *p);
int probe_dumps(const dj_probe *p, uint32_t layer);  // rows after this layer are recorded
int probe_any_dump(const dj_probe *p);
int probe_tapped(const dj_probe *p, uint32_t layer);  // a tap reads or writes rows after this layer
int probe_any_tap(const dj_probe *p);
// The tap row of (slot, pos) after `layer` (dim floats: to fill, or *replace 1: to write into the stream), or NULL.
float *probe_tap_row(dj_probe *p, uint32_t layer, int32_t slot, int64_t pos, int *replace);
// The same row without counting it as passed (NULL where none): the engine on several GPUs, whose GPUs after the
// first only write the replacing rows into their own streams (probe_gpu.c).
const float *probe_tap_peek(const dj_probe *p, uint32_t layer, int32_t slot, int64_t pos, int *replace);
// The vector added after `layer` (dim floats, the scales applied), or NULL. Its zero entries are -0.0f, the
// identity of float addition (x + -0.0f is x for every x, -0.0f included; x + 0.0f turns -0.0f into 0.0f): a zero
// vector leaves the residual stream bitwise as it was.
const float *probe_vector(const dj_probe *p, uint32_t layer);
// Rows computed after `layer`: x (T, dim) the residual stream, row t the token tokens[t] at position pos[t] of KV
// slot slots[t]. Recorded when the layer is dumped; the first error sticks (probe_finish returns it too).
int probe_record(dj_probe *p, uint32_t layer, const float *x, int64_t T, const int32_t *tokens, const int64_t *pos,
                 const int32_t *slots, dj_err *e);
// The CPU engine's hook: the layer's vector added to every row of x (T, dim), the taps' rows copied out or in, then
// probe_record.
int probe_rows(dj_probe *p, uint32_t layer, float *x, int64_t T, const int32_t *tokens, const int64_t *pos,
               const int32_t *slots, dj_err *e);

#endif
