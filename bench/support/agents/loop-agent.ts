// The agent loop of bench:rollouts-hosted, the same code in both of its arms: hosted in an
// agent sandbox (its model through the gateway) and run by the trainer (its model called
// directly). The official `openai` SDK (from OPENAI_BASE_URL, OPENAI_API_KEY) and the rollbox
// client (its tool calls in ROLLBOX_SANDBOX_ID). It times each model call as the agent sees
// it and prints the times as its last line of output: {"modelMs": [...]}.
import OpenAI from 'openai';
import { performance } from 'node:perf_hooks';
import { RollboxClient } from '../../../src/client/index.ts';

const openai = new OpenAI({ maxRetries: 5, timeout: 600_000 });
const rollbox = new RollboxClient({ baseUrl: process.env.ROLLBOX_URL!, token: process.env.ROLLBOX_API_KEY! });
const sandboxId = process.env.ROLLBOX_SANDBOX_ID!;
const tools: OpenAI.ChatCompletionTool[] = [{ type: 'function', function: { name: 'bash', description: 'Run a shell command in the task sandbox', parameters: { type: 'object', properties: { cmd: { type: 'string' } }, required: ['cmd'] } } }];
const messages: OpenAI.ChatCompletionMessageParam[] = [{ role: 'user', content: process.env.AGENT_TASK ?? 'Fix the bug.' }];
const modelMs: number[] = [];

for (let turn = 0; turn < 200; turn++) {
  const started = performance.now();
  const message = (await openai.chat.completions.create({ model: 'm', messages, tools })).choices[0]!.message;
  modelMs.push(Math.round((performance.now() - started) * 1000) / 1000);
  messages.push(message);
  if (!message.tool_calls?.length) {
    console.log(JSON.stringify({ modelMs }));
    process.exit(0);
  }
  for (const call of message.tool_calls) {
    if (call.type !== 'function') continue;
    const { cmd } = JSON.parse(call.function.arguments) as { cmd: string };
    const result = await rollbox.exec(sandboxId, { cmd });
    messages.push({ role: 'tool', tool_call_id: call.id, content: `exit ${result.exitCode}\n${result.stdout}${result.stderr}` });
  }
}
console.error('no answer without tool calls in 200 turns');
process.exit(1);
