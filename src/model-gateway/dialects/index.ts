import type { ModelApi } from '../../api/index.ts';
import { messages } from './anthropic.ts';
import type { Dialect } from './dialect.ts';
import { chatCompletions, completions } from './openai.ts';
import { responses } from './responses.ts';

export { TokenAcc, errorBody, errorOf, parsed, serialized } from './dialect.ts';
export type { Asked, Assembler, Dialect, Json, StreamEvent } from './dialect.ts';

export const DIALECTS: Readonly<Record<ModelApi, Dialect>> = { 'chat.completions': chatCompletions, completions, responses, messages };
