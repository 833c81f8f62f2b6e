// Lint rules worth their noise for this codebase: the recommended JavaScript and
// TypeScript sets, plus the type-aware checks that catch what async Node code gets wrong
// (a promise nobody awaits or catches; a promise passed where a callback's result is ignored).
import js from '@eslint/js';
import tseslint from 'typescript-eslint';

export default tseslint.config(
  { ignores: ['node_modules/', 'build/', 'bench/out/', '.scratch/'] },
  js.configs.recommended,
  ...tseslint.configs.recommended,
  {
    files: ['**/*.ts'],
    languageOptions: { parserOptions: { projectService: true, tsconfigRootDir: import.meta.dirname } },
    rules: {
      '@typescript-eslint/no-floating-promises': 'error',
      '@typescript-eslint/no-misused-promises': ['error', { checksVoidReturn: { arguments: false } }],
      '@typescript-eslint/no-unused-vars': ['error', { argsIgnorePattern: '^_', varsIgnorePattern: '^_', caughtErrors: 'none' }],
    },
  },
  {
    // Hollow worker hosts (src/workers/hollow) run nothing: only benchmarks may start them
    // (their guard refuses any other entry script at run time too); no test relies on them.
    files: ['src/**/*.ts', 'test/**/*.ts'],
    ignores: ['src/workers/hollow/**'],
    rules: { 'no-restricted-imports': ['error', { patterns: [{ group: ['**/workers/hollow', '**/workers/hollow/**', '**/hollow/index.ts'], message: 'hollow worker hosts are for bench/ only' }] }] },
  },
  {
    // Tests and benchmarks read arbitrary JSON answers; `any` there is the honest type.
    files: ['test/**/*.ts', 'bench/**/*.ts'],
    rules: { '@typescript-eslint/no-explicit-any': 'off' },
  },
  {
    files: ['**/*.js', '**/*.mjs'],
    languageOptions: { globals: { process: 'readonly', console: 'readonly' } },
  },
);
