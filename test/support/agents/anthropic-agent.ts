// A hosted rollout's agent written against the official `@anthropic-ai/sdk` (configured from
// ANTHROPIC_BASE_URL and ANTHROPIC_API_KEY, as rollbox sets them) and the rollbox client
// running its tool calls in the task sandbox. Bundled by test/support/agent-layer.ts into one
// file run by node inside an agent sandbox; nothing in it knows about tests.
import Anthropic from '@anthropic-ai/sdk';
import { RollboxClient } from '../../../src/client/index.ts';

const anthropic = new Anthropic({ maxRetries: Number(process.env.AGENT_MAX_RETRIES ?? 5), timeout: Number(process.env.AGENT_TIMEOUT_MS ?? 600_000) });
const rollbox = new RollboxClient({ baseUrl: process.env.ROLLBOX_URL!, token: process.env.ROLLBOX_API_KEY! });
const sandboxId = process.env.ROLLBOX_SANDBOX_ID!;
const tools: Anthropic.Tool[] = [{ name: 'bash', description: 'Run a shell command in the task sandbox', input_schema: { type: 'object', properties: { cmd: { type: 'string' } }, required: ['cmd'] } }];
const messages: Anthropic.MessageParam[] = [{ role: 'user', content: process.env.AGENT_TASK ?? 'Fix the bug.' }];

for (let turn = 0; turn < 50; turn++) {
  const request = { model: 'm', max_tokens: 1024, messages, tools };
  // Streamed on odd turns when asked: both paths of the SDK go through the gateway.
  const message = process.env.AGENT_STREAM === '1' && turn % 2 === 1 ? await anthropic.messages.stream(request).finalMessage() : await anthropic.messages.create(request);
  messages.push({ role: 'assistant', content: message.content });
  const calls = message.content.filter((b): b is Anthropic.ToolUseBlock => b.type === 'tool_use');
  if (calls.length === 0) {
    console.log(message.content.flatMap((b) => (b.type === 'text' ? [b.text] : [])).join(''));
    process.exit(0);
  }
  const results: Anthropic.ToolResultBlockParam[] = [];
  for (const call of calls) {
    const { cmd } = call.input as { cmd: string };
    const result = await rollbox.exec(sandboxId, { cmd });
    results.push({ type: 'tool_result', tool_use_id: call.id, content: `exit ${result.exitCode}\n${result.stdout}${result.stderr}` });
  }
  messages.push({ role: 'user', content: results });
}
console.error('no answer without tool calls in 50 turns');
process.exit(1);
