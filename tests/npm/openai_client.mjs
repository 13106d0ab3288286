// openai_client.mjs: OpenAI's own npm client (tests/npm/package.json) against `djinn serve`, for
// server::openai_node_client: both endpoints, streaming and not, greedy. Prints one JSON object on stdout:
// the four answers' texts, finish reasons and usage as the client parsed them; the C test compares them with the
// command line's text. Usage: node openai_client.mjs BASE_URL API_KEY PROMPT USER_MESSAGE MAX_TOKENS
import OpenAI from 'openai';

const [base, apiKey, prompt, user, maxTokens] = process.argv.slice(2);
const client = new OpenAI({ baseURL: base, apiKey, maxRetries: 0, timeout: 60000 });
const max_tokens = Number(maxTokens);
const out = {};

const models = await client.models.list();
out.models = models.data.map((m) => m.id);

const c = await client.completions.create({ model: out.models[0], prompt, max_tokens, temperature: 0 });
out.completion = c.choices[0].text;
out.completion_finish = c.choices[0].finish_reason;
out.completion_usage = c.usage;

let text = '', finish = null;
const cs = await client.completions.create({ model: out.models[0], prompt, max_tokens, temperature: 0, stream: true });
for await (const chunk of cs) {
  text += chunk.choices[0]?.text ?? '';
  finish = chunk.choices[0]?.finish_reason ?? finish;
}
out.completion_stream = text;
out.completion_stream_finish = finish;

const messages = [{ role: 'system', content: 'Be brief.' }, { role: 'user', content: user }];
const r = await client.chat.completions.create({ model: out.models[0], messages, max_tokens, temperature: 0 });
out.chat = r.choices[0].message.content;
out.chat_role = r.choices[0].message.role;
out.chat_finish = r.choices[0].finish_reason;

text = '';
finish = null;
let usage = null;
const rs = await client.chat.completions.create({
  model: out.models[0], messages, max_tokens, temperature: 0, stream: true, stream_options: { include_usage: true },
});
for await (const chunk of rs) {
  text += chunk.choices[0]?.delta?.content ?? '';
  finish = chunk.choices[0]?.finish_reason ?? finish;
  if (chunk.usage) usage = chunk.usage;
}
out.chat_stream = text;
out.chat_stream_finish = finish;
out.chat_stream_usage = usage;

// A wrong key: the client raises its authentication error for the 401.
try {
  await new OpenAI({ baseURL: base, apiKey: 'wrong', maxRetries: 0 }).models.list();
  out.wrong_key = 'accepted';
} catch (e) {
  out.wrong_key = `${e.constructor.name} ${e.status}`;
}
console.log(JSON.stringify(out));
