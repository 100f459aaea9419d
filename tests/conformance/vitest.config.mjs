import { defineConfig } from "vitest/config"

// Vitest's default globs drop files under node_modules, which is where the
// suite lives; include only our wrapper.
export default defineConfig({
  test: {
    include: ["conformance.test.mjs"],
  },
})
