// A hosted rollout's agent as a team would write it: the official `openai` SDK (configured
// from OPENAI_BASE_URL and OPENAI_API_KEY, as rollbox sets them) and the rollbox client
// running its tool calls in the task sandbox. Bundled by test/support/agent-layer.ts into
// one file run by node inside an agent sandbox; nothing in it knows about tests.
import OpenAI from 'openai';
import { RollboxClient } from '../../../src/client/index.ts';

const openai = new OpenAI({ maxRetries: Number(process.env.AGENT_MAX_RETRIES ?? 5), timeout: Number(process.env.AGENT_TIMEOUT_MS ?? 600_000) });
const rollbox = new RollboxClient({ baseUrl: process.env.ROLLBOX_URL!, token: process.env.ROLLBOX_API_KEY! });
const sandboxId = process.env.ROLLBOX_SANDBOX_ID!;
const tools: OpenAI.ChatCompletionTool[] = [{ type: 'function', function: { name: 'bash', description: 'Run a shell command in the task sandbox', parameters: { type: 'object', properties: { cmd: { type: 'string' } }, required: ['cmd'] } } }];
const messages: OpenAI.ChatCompletionMessageParam[] = [{ role: 'user', content: process.env.AGENT_TASK ?? 'Fix the bug.' }];

for (let turn = 0; turn < 50; turn++) {
  const stream = process.env.AGENT_STREAM === '1' && turn % 2 === 1;
  let message: OpenAI.ChatCompletionMessage;
  if (stream) {
    const runner = openai.chat.completions.stream({ model: 'm', messages, tools });
    message = (await runner.finalChatCompletion()).choices[0]!.message;
  } else {
    message = (await openai.chat.completions.create({ model: 'm', messages, tools })).choices[0]!.message;
  }
  messages.push(message);
  if (!message.tool_calls?.length) {
    console.log(message.content);
    process.exit(0);
  }
  for (const call of message.tool_calls) {
    if (call.type !== 'function') continue;
    const { cmd } = JSON.parse(call.function.arguments) as { cmd: string };
    const result = await rollbox.exec(sandboxId, { cmd });
    messages.push({ role: 'tool', tool_call_id: call.id, content: `exit ${result.exitCode}\n${result.stdout}${result.stderr}` });
  }
}
console.error('no answer without tool calls in 50 turns');
process.exit(1);
