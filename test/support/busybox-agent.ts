/**
 * The smallest hosted-rollout agent, for busybox: one chat completion through the gateway
 * (OPENAI_BASE_URL, its rollout key), then `echo tool-$AGENT_N` in its task sandbox through the
 * rollbox API (command id `tool-$AGENT_N`). Its trajectory: a model call, then that command.
 */
export const BUSYBOX_AGENT_CMD = [
  `wget -q -O- --header 'Content-Type: application/json' --header "authorization: Bearer $OPENAI_API_KEY"`,
  `--post-data '{"model":"m","messages":[{"role":"user","content":"go"}]}' "$OPENAI_BASE_URL/chat/completions"`,
  `&& wget -q -O- --header 'Content-Type: application/json' --header "authorization: Bearer $ROLLBOX_API_KEY"`,
  `--post-data "{\\"cmd\\":\\"echo tool-$AGENT_N\\",\\"commandId\\":\\"tool-$AGENT_N\\"}" "$ROLLBOX_URL/v1/sandboxes/$ROLLBOX_SANDBOX_ID/exec"`,
].join(' ');
