package sim

import (
	"encoding/json"
	"errors"
	"fmt"
	"hash/fnv"
	"io"
	"math"
	"net/http"
	"strconv"
	"strings"
)

// API shapes the sim answers.
type apiKind int

const (
	chatAPI apiKind = iota
	completionAPI
)

const (
	maxRequestBody   = 10 << 20
	defaultMaxTokens = 16
	maxOutputTokens  = 4096
	embeddingDims    = 16
)

// completionRequest is the part of an OpenAI request the sim reads.
type completionRequest struct {
	Model               string          `json:"model"`
	Messages            json.RawMessage `json:"messages"`
	Prompt              json.RawMessage `json:"prompt"`
	Input               json.RawMessage `json:"input"`
	MaxTokens           *int            `json:"max_tokens"`
	MaxCompletionTokens *int            `json:"max_completion_tokens"`
	Stream              bool            `json:"stream"`
}

// estimateTokens approximates a prompt's token count as a tokenizer would
// on English text: about four bytes a token.
func estimateTokens(raw ...json.RawMessage) int {
	n := 0
	for _, r := range raw {
		n += len(r)
	}
	return max(1, n/4)
}

// words is the text the sim generates, one word a token.
var words = strings.Fields("the grid routes every request to the least loaded healthy site that serves its model and streams the answer back")

func (s *Sim) readRequest(w http.ResponseWriter, r *http.Request) (*completionRequest, bool) {
	body, err := io.ReadAll(http.MaxBytesReader(w, r.Body, maxRequestBody))
	if err != nil {
		var tooBig *http.MaxBytesError
		if errors.As(err, &tooBig) {
			writeOpenAIError(w, http.StatusRequestEntityTooLarge, "request body too large", "BadRequestError")
		} else {
			writeOpenAIError(w, http.StatusBadRequest, "read body: "+err.Error(), "BadRequestError")
		}
		return nil, false
	}
	var req completionRequest
	if err := json.Unmarshal(body, &req); err != nil {
		writeOpenAIError(w, http.StatusBadRequest, "invalid JSON body: "+err.Error(), "BadRequestError")
		return nil, false
	}
	if req.Model != s.opts.Model {
		writeOpenAIError(w, http.StatusNotFound, fmt.Sprintf("The model `%s` does not exist.", req.Model), "NotFoundError")
		return nil, false
	}
	return &req, true
}

// outputTokens applies max_tokens: default 16, capped at 4096.
func (req *completionRequest) outputTokens() (n int, reason string, err error) {
	limit := req.MaxTokens
	if limit == nil {
		limit = req.MaxCompletionTokens
	}
	if limit == nil {
		return defaultMaxTokens, "stop", nil
	}
	if *limit < 1 {
		return 0, "", fmt.Errorf("max_tokens must be at least 1, got %d", *limit)
	}
	return min(*limit, maxOutputTokens), "length", nil
}

// request headers the EPP reads.
const (
	fairnessHeader  = "x-llm-d-inference-fairness-id"
	defaultFairness = "default-flow"
)

func (s *Sim) handleCompletion(api apiKind) http.HandlerFunc {
	return func(w http.ResponseWriter, r *http.Request) {
		received := s.clk.Now()
		req, ok := s.readRequest(w, r)
		if !ok {
			return
		}
		n, reason, err := req.outputTokens()
		if err != nil {
			writeOpenAIError(w, http.StatusBadRequest, err.Error(), "BadRequestError")
			return
		}
		rec := s.epp.begin(req.Model, r.Header.Get(fairnessHeader))
		if s.chance(s.state().ErrorRate) {
			rec.fail("ModelServerError")
			writeOpenAIError(w, http.StatusInternalServerError, "simulated engine failure", "InternalServerError")
			return
		}
		prompt := estimateTokens(req.Messages, req.Prompt)
		e, hasSlot, err := s.route(r.Context(), rec.fairness)
		if err != nil {
			rec.fail("ServiceUnavailable")
			if r.Context().Err() == nil {
				writeOpenAIError(w, http.StatusServiceUnavailable, err.Error(), "ServiceUnavailableError")
			}
			return
		}
		rec.dispatched(e.name, prompt)
		w.Header().Set("x-sim-endpoint", e.name)

		id := fmt.Sprintf("%s-%d", map[apiKind]string{chatAPI: "chatcmpl", completionAPI: "cmpl"}[api], s.nextID.Add(1))
		created := received.Unix()
		j := job{promptTokens: prompt, outputTokens: n, finishReason: reason, hasSlot: hasSlot}
		if s.opts.PrefixCacheTokens > 0 {
			j.blocks = promptBlocks(req.Messages, req.Prompt)
		}
		var text strings.Builder
		var emit func(i int) error
		var flusher http.Flusher
		if req.Stream {
			flusher, _ = w.(http.Flusher)
			w.Header().Set("Content-Type", "text/event-stream")
			w.Header().Set("Cache-Control", "no-cache")
			w.WriteHeader(http.StatusOK)
			if flusher != nil {
				flusher.Flush()
			}
			emit = func(i int) error {
				if i == 0 {
					rec.firstByte(s.clk.Now())
				}
				chunk := streamChunk(api, id, created, req.Model, i, words[i%len(words)]+" ")
				if _, err := fmt.Fprintf(w, "data: %s\n\n", chunk); err != nil {
					return err
				}
				if flusher != nil {
					flusher.Flush()
				}
				return nil
			}
		} else {
			emit = func(i int) error {
				text.WriteString(words[i%len(words)] + " ")
				return nil
			}
		}
		tm, err := e.serve(r.Context(), j, s.opts.TTFT, s.opts.PrefillPerToken, s.opts.TPOT, emit)
		if err != nil {
			rec.abort()
			return
		}
		if req.Stream {
			fmt.Fprintf(w, "data: %s\n\n", finalChunk(api, id, created, req.Model, reason, prompt, tm.tokens))
			io.WriteString(w, "data: [DONE]\n\n")
			if flusher != nil {
				flusher.Flush()
			}
		} else {
			rec.firstByte(s.clk.Now())
			writeJSON(w, http.StatusOK, fullResponse(api, id, created, req.Model, text.String(), reason, prompt, tm.tokens))
		}
		rec.done(req.Stream, tm)
	}
}

func streamChunk(api apiKind, id string, created int64, model string, i int, token string) []byte {
	var choice map[string]any
	object := "chat.completion.chunk"
	if api == chatAPI {
		delta := map[string]any{"content": token}
		if i == 0 {
			delta["role"] = "assistant"
		}
		choice = map[string]any{"index": 0, "delta": delta, "logprobs": nil, "finish_reason": nil}
	} else {
		object = "text_completion"
		choice = map[string]any{"index": 0, "text": token, "logprobs": nil, "finish_reason": nil}
	}
	b, _ := json.Marshal(map[string]any{"id": id, "object": object, "created": created, "model": model, "choices": []any{choice}})
	return b
}

func finalChunk(api apiKind, id string, created int64, model, reason string, prompt, completion int) []byte {
	object := "chat.completion.chunk"
	choice := map[string]any{"index": 0, "delta": map[string]any{}, "logprobs": nil, "finish_reason": reason}
	if api == completionAPI {
		object = "text_completion"
		choice = map[string]any{"index": 0, "text": "", "logprobs": nil, "finish_reason": reason}
	}
	b, _ := json.Marshal(map[string]any{
		"id": id, "object": object, "created": created, "model": model, "choices": []any{choice},
		"usage": usage(prompt, completion),
	})
	return b
}

func fullResponse(api apiKind, id string, created int64, model, text, reason string, prompt, completion int) map[string]any {
	if api == chatAPI {
		return map[string]any{
			"id": id, "object": "chat.completion", "created": created, "model": model,
			"choices": []any{map[string]any{
				"index": 0, "message": map[string]any{"role": "assistant", "content": text},
				"logprobs": nil, "finish_reason": reason,
			}},
			"usage": usage(prompt, completion),
		}
	}
	return map[string]any{
		"id": id, "object": "text_completion", "created": created, "model": model,
		"choices": []any{map[string]any{"index": 0, "text": text, "logprobs": nil, "finish_reason": reason}},
		"usage":   usage(prompt, completion),
	}
}

func usage(prompt, completion int) map[string]int {
	return map[string]int{"prompt_tokens": prompt, "completion_tokens": completion, "total_tokens": prompt + completion}
}

// handleEmbeddings runs a prefill-only job (one step of TTFT) and answers a
// deterministic unit vector per input.
func (s *Sim) handleEmbeddings(w http.ResponseWriter, r *http.Request) {
	req, ok := s.readRequest(w, r)
	if !ok {
		return
	}
	if s.chance(s.state().ErrorRate) {
		writeOpenAIError(w, http.StatusInternalServerError, "simulated engine failure", "InternalServerError")
		return
	}
	var inputs []string
	if err := json.Unmarshal(req.Input, &inputs); err != nil {
		var one string
		if err := json.Unmarshal(req.Input, &one); err != nil {
			writeOpenAIError(w, http.StatusBadRequest, "input must be a string or a list of strings", "BadRequestError")
			return
		}
		inputs = []string{one}
	}
	prompt := estimateTokens(req.Input)
	e, hasSlot, err := s.route(r.Context(), defaultFairness)
	if err != nil {
		if r.Context().Err() == nil {
			writeOpenAIError(w, http.StatusServiceUnavailable, err.Error(), "ServiceUnavailableError")
		}
		return
	}
	w.Header().Set("x-sim-endpoint", e.name)
	j := job{promptTokens: prompt, outputTokens: 1, finishReason: "stop", hasSlot: hasSlot}
	if _, err := e.serve(r.Context(), j, s.opts.TTFT, s.opts.PrefillPerToken, 0, func(int) error { return nil }); err != nil {
		return
	}
	data := make([]any, len(inputs))
	for i, in := range inputs {
		data[i] = map[string]any{"object": "embedding", "index": i, "embedding": embed(in)}
	}
	writeJSON(w, http.StatusOK, map[string]any{"object": "list", "model": req.Model, "data": data, "usage": usage(prompt, 0)})
}

func embed(s string) []float64 {
	h := fnv.New64a()
	io.WriteString(h, s)
	seed := h.Sum64()
	v := make([]float64, embeddingDims)
	var norm float64
	for i := range v {
		seed ^= seed << 13
		seed ^= seed >> 7
		seed ^= seed << 17
		v[i] = float64(int64(seed%2001)-1000) / 1000
		norm += v[i] * v[i]
	}
	norm = math.Sqrt(norm)
	for i := range v {
		if norm > 0 {
			v[i] /= norm
		}
	}
	return v
}

func (s *Sim) handleModels(w http.ResponseWriter, r *http.Request) {
	owner := map[string]string{KindEPP: "llm-d", KindVLLM: "vllm", KindSGLang: "sglang"}[s.opts.Kind]
	writeJSON(w, http.StatusOK, map[string]any{
		"object": "list",
		"data": []any{map[string]any{
			"id": s.opts.Model, "object": "model", "created": s.start.Unix(), "owned_by": owner,
			"max_model_len": 40960,
		}},
	})
}

// writeOpenAIError answers in the error shape OpenAI-compatible servers use.
func writeOpenAIError(w http.ResponseWriter, status int, msg, typ string) {
	writeJSON(w, status, map[string]any{
		"error": map[string]any{"message": msg, "type": typ, "param": nil, "code": strconv.Itoa(status)},
	})
}
