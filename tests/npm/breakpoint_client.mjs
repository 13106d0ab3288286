// breakpoint_client.mjs: OpenAI's own npm client (tests/npm/package.json) driving `djinn serve`'s breakpoints, for
// server::breakpoint_openai_node_client. The fields beyond OpenAI's (break_after_layer, resume) go in the body as
// any other field; the answer's "breakpoint" is read from what the client parsed. Greedy: a completion stopped after
// LAYER and resumed with its residual unchanged, then with it changed (every value plus a fixed pattern of the
// rows' RMS); a chat stopped and resumed as a stream; a second resume of one id (the client's error). Prints one JSON
// object on stdout; the C test compares the texts with the command line's.
// Usage: node breakpoint_client.mjs BASE_URL API_KEY PROMPT USER_MESSAGE MAX_TOKENS LAYER
import OpenAI from 'openai';

const [base, apiKey, prompt, user, maxTokens, layerArg] = process.argv.slice(2);
const client = new OpenAI({ baseURL: base, apiKey, maxRetries: 0, timeout: 60000 });
const max_tokens = Number(maxTokens);
const layer = Number(layerArg);
const model = (await client.models.list()).data[0].id;
const out = {};

// The residual as floats and back (little-endian float32, base64).
const rowsOf = (b64) => {
  const bytes = Buffer.from(b64, 'base64');
  return new Float32Array(bytes.buffer.slice(bytes.byteOffset, bytes.byteOffset + bytes.length));
};
const base64Of = (rows) => Buffer.from(rows.buffer).toString('base64');

const b = await client.completions.create({ model, prompt, max_tokens, temperature: 0, break_after_layer: layer });
const { residual, ...brk } = b.breakpoint;
out.breakpoint = { ...brk, finish: b.choices[0].finish_reason, text: b.choices[0].text, floats: rowsOf(residual).length };
const r = await client.completions.create({
  model, prompt, max_tokens, temperature: 0, resume: { id: brk.id, residual },
});
out.resumed = r.choices[0].text;

const b2 = await client.completions.create({ model, prompt, max_tokens, temperature: 0, break_after_layer: layer });
const rows = rowsOf(b2.breakpoint.residual);
const rms = Math.sqrt(rows.reduce((s, x) => s + x * x, 0) / rows.length);
for (let i = 0; i < rows.length; i++) rows[i] += rms * (((i * 7919) % 13) - 6) / 6;
const n = await client.completions.create({
  model, max_tokens, temperature: 0, resume: { id: b2.breakpoint.id, residual: base64Of(rows) },
});
out.changed = n.choices[0].text;

const messages = [{ role: 'system', content: 'Be brief.' }, { role: 'user', content: user }];
const c = await client.chat.completions.create({ model, messages, max_tokens, temperature: 0, break_after_layer: layer });
out.chat_finish = c.choices[0].finish_reason;
const rs = await client.chat.completions.create({
  model, messages, max_tokens, temperature: 0, stream: true,
  resume: { id: c.breakpoint.id, residual: c.breakpoint.residual },
});
let text = '';
for await (const chunk of rs) text += chunk.choices[0]?.delta?.content ?? '';
out.chat_resumed_stream = text;

try {
  await client.completions.create({ model, prompt, max_tokens, temperature: 0, resume: { id: brk.id, residual } });
  out.again = 'accepted';
} catch (e) {
  out.again = { status: e.status, message: e.error?.message ?? e.message, param: e.error?.param };
}
console.log(JSON.stringify(out));
