package main

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"net/http"
	"os"
	"slices"
	"strings"

	"github.com/getkin/kin-openapi/openapi2"
	"github.com/getkin/kin-openapi/openapi2conv"
	"github.com/getkin/kin-openapi/openapi3"
	"google.golang.org/protobuf/reflect/protoreflect"

	adminv1 "github.com/ursula/ursula/proto/gen/go/ursula/admin/v1"
)

func main() {
	draft := flag.String("admin-draft", "proto/gen/openapi/ursula/admin/v1/admin.swagger.json", "the OpenAPI 2 draft of protoc-gen-openapiv2 (deleted once converted)")
	adminPart := flag.String("admin-part", "services/node/openapi/admin.yaml", "the hand-kept part of the admin document")
	adminOut := flag.String("admin-out", "services/node/openapi/admin.json", "where the admin document goes")
	dataIn := flag.String("data-plane", "gateway/openapi.yaml", "the hand-kept data-plane document")
	dataOut := flag.String("data-plane-out", "gateway/openapi.json", "where its JSON form goes")
	flag.Parse()
	if err := run(*draft, *adminPart, *adminOut, *dataIn, *dataOut); err != nil {
		fmt.Fprintln(os.Stderr, "openapigen:", err)
		os.Exit(1)
	}
}

func run(draft, adminPart, adminOut, dataIn, dataOut string) error {
	ctx := context.Background()
	admin, err := buildAdmin(draft, adminPart)
	if err != nil {
		return err
	}
	if err := write(ctx, admin, adminOut); err != nil {
		return err
	}
	if err := os.Remove(draft); err != nil {
		return fmt.Errorf("remove the draft: %w", err)
	}
	data, err := load(dataIn)
	if err != nil {
		return err
	}
	return write(ctx, data, dataOut)
}

// load reads and resolves an OpenAPI 3 document (YAML or JSON).
func load(path string) (*openapi3.T, error) {
	doc, err := openapi3.NewLoader().LoadFromFile(path)
	if err != nil {
		return nil, fmt.Errorf("load %s: %w", path, err)
	}
	return doc, nil
}

// write validates doc and writes it as indented JSON with sorted keys.
func write(ctx context.Context, doc *openapi3.T, path string) error {
	if err := doc.Validate(ctx); err != nil {
		return fmt.Errorf("%s: invalid OpenAPI 3: %w", path, err)
	}
	raw, err := json.Marshal(doc)
	if err != nil {
		return fmt.Errorf("%s: %w", path, err)
	}
	// Round trip through a map: encoding/json sorts map keys.
	var v any
	if err := json.Unmarshal(raw, &v); err != nil {
		return err
	}
	var buf bytes.Buffer
	enc := json.NewEncoder(&buf)
	enc.SetIndent("", "  ")
	enc.SetEscapeHTML(false)
	if err := enc.Encode(v); err != nil {
		return err
	}
	if err := os.WriteFile(path, buf.Bytes(), 0o644); err != nil {
		return fmt.Errorf("write %s: %w", path, err)
	}
	return nil
}

// buildAdmin converts the draft and merges the hand-kept part into it.
func buildAdmin(draftPath, partPath string) (*openapi3.T, error) {
	raw, err := os.ReadFile(draftPath)
	if err != nil {
		return nil, fmt.Errorf("read the draft (run buf generate first): %w", err)
	}
	var v2 openapi2.T
	if err := json.Unmarshal(raw, &v2); err != nil {
		return nil, fmt.Errorf("decode %s: %w", draftPath, err)
	}
	doc, err := openapi2conv.ToV3(&v2)
	if err != nil {
		return nil, fmt.Errorf("convert %s: %w", draftPath, err)
	}
	part, err := load(partPath)
	if err != nil {
		return nil, err
	}

	// The proto messages: 64-bit integers are numbers, and every field of
	// an answer is present (EmitUnpopulated).
	file := adminv1.File_ursula_admin_v1_admin_proto
	for name, s := range doc.Components.Schemas {
		wireSchema(s, true)
		if md := file.Messages().ByName(protoreflect.Name(name)); md != nil {
			integerFormats(s.Value, md)
		}
	}
	methods := file.Services().ByName("AdminService").Methods()
	for _, item := range doc.Paths.Map() {
		for _, op := range item.Operations() {
			var in protoreflect.MessageDescriptor
			if m := methods.ByName(protoreflect.Name(op.OperationID)); m != nil {
				in = m.Input()
			}
			for _, p := range op.Parameters {
				wireSchema(p.Value.Schema, false)
				if in != nil {
					if fd := in.Fields().ByName(protoreflect.Name(p.Value.Name)); fd != nil {
						integerFormat(p.Value.Schema.Value, fd)
					}
				}
			}
			for _, r := range op.Responses.Map() {
				if r.Value == nil {
					continue
				}
				for _, mt := range r.Value.Content {
					wireSchema(mt.Schema, true)
				}
			}
			op.Tags = nil
		}
	}
	doc.Tags = nil

	doc.Info = part.Info
	doc.Servers = part.Servers
	doc.Security = part.Security
	for name, s := range part.Components.Schemas {
		if _, dup := doc.Components.Schemas[name]; dup {
			return nil, fmt.Errorf("%s: schema %s is also a proto message", partPath, name)
		}
		doc.Components.Schemas[name] = s
	}
	doc.Components.Parameters = part.Components.Parameters
	doc.Components.Responses = part.Components.Responses
	doc.Components.Headers = part.Components.Headers
	doc.Components.SecuritySchemes = part.Components.SecuritySchemes
	for path, item := range part.Paths.Map() {
		for method, op := range item.Operations() {
			doc.AddOperation(path, method, op)
		}
		// The node's mux answers HEAD on every hand-written GET route.
		if get := item.Get; get != nil && item.Head == nil {
			doc.AddOperation(path, http.MethodHead, headOf(get))
		}
	}
	// GetReadyResponse is only the gRPC answer now; its REST route is the
	// hand-written one.
	delete(doc.Components.Schemas, "GetReadyResponse")
	delete(doc.Components.Schemas, "NullValue")

	// Every operation may answer an error; every mutation needs the
	// process incarnation (adminGuard).
	errRef := &openapi3.ResponseRef{Ref: "#/components/responses/Error"}
	incRef := &openapi3.ParameterRef{Ref: "#/components/parameters/ProcessIncarnation"}
	for _, item := range doc.Paths.Map() {
		for method, op := range item.Operations() {
			switch {
			case op.Responses.Default() != nil:
			case method == http.MethodHead:
				op.Responses.Set("default", &openapi3.ResponseRef{Value: &openapi3.Response{Description: new("An error, without its body.")}})
			default:
				op.Responses.Set("default", errRef)
			}
			if method != http.MethodGet && method != http.MethodHead {
				op.Parameters = append(slices.Clone(op.Parameters), incRef)
			}
		}
	}
	if err := checkOperationIDs(doc); err != nil {
		return nil, err
	}
	// Resolve the references added above.
	raw, err = json.Marshal(doc)
	if err != nil {
		return nil, err
	}
	out, err := openapi3.NewLoader().LoadFromData(raw)
	if err != nil {
		return nil, fmt.Errorf("reload the admin document: %w", err)
	}
	return out, nil
}

// wireSchema rewrites a schema the way adminJSON renders its values: a
// 64-bit integer (an OpenAPI 2 string of format int64 or uint64) is a
// number; with answer set, every property of an object is required.
func wireSchema(ref *openapi3.SchemaRef, answer bool) {
	if ref == nil || ref.Ref != "" || ref.Value == nil {
		return
	}
	s := ref.Value
	if s.Type.Is(openapi3.TypeString) && (s.Format == "int64" || s.Format == "uint64") {
		s.Type = &openapi3.Types{openapi3.TypeInteger}
	}
	if answer && s.Type.Is(openapi3.TypeObject) && len(s.Properties) > 0 {
		s.Required = nil
		for name := range s.Properties {
			s.Required = append(s.Required, name)
		}
		slices.Sort(s.Required)
		s.AdditionalProperties = openapi3.AdditionalProperties{Has: new(false)}
	}
	for _, p := range s.Properties {
		wireSchema(p, answer)
	}
	wireSchema(s.Items, answer)
}

// checkOperationIDs fails on a missing or repeated operation id.
func checkOperationIDs(doc *openapi3.T) error {
	seen := map[string]string{}
	var errs []error
	for path, item := range doc.Paths.Map() {
		for method, op := range item.Operations() {
			where := method + " " + path
			switch prev, dup := seen[op.OperationID]; {
			case op.OperationID == "":
				errs = append(errs, fmt.Errorf("%s has no operationId", where))
			case dup:
				errs = append(errs, fmt.Errorf("%s and %s share operationId %s", where, prev, op.OperationID))
			}
			seen[op.OperationID] = where
		}
	}
	return errors.Join(errs...)
}

// headOf is the HEAD operation of a GET route: its answers without their
// bodies.
func headOf(get *openapi3.Operation) *openapi3.Operation {
	head := &openapi3.Operation{
		OperationID: "Head" + strings.TrimPrefix(get.OperationID, "Get"),
		Summary:     "As GET, without the body.",
		Parameters:  get.Parameters,
		Responses:   openapi3.NewResponses(),
	}
	head.Responses.Delete("default")
	for status, r := range get.Responses.Map() {
		if r.Value == nil {
			continue // a reference: an error, added back without its body
		}
		head.Responses.Set(status, &openapi3.ResponseRef{Value: &openapi3.Response{
			Description: r.Value.Description,
			Headers:     r.Value.Headers,
		}})
	}
	return head
}

// integerFormats sets the format of the integer properties of a message's
// schema from the proto field kinds: protoc-gen-openapiv2 calls a uint32
// int64.
func integerFormats(s *openapi3.Schema, md protoreflect.MessageDescriptor) {
	for name, p := range s.Properties {
		fd := md.Fields().ByName(protoreflect.Name(name))
		if fd == nil || p.Value == nil {
			continue
		}
		if fd.IsList() && p.Value.Items != nil && p.Value.Items.Value != nil {
			integerFormat(p.Value.Items.Value, fd)
			continue
		}
		integerFormat(p.Value, fd)
	}
}

// integerFormat sets an integer schema's format from its field's kind.
func integerFormat(s *openapi3.Schema, fd protoreflect.FieldDescriptor) {
	if s == nil || !s.Type.Is(openapi3.TypeInteger) {
		return
	}
	switch fd.Kind() {
	case protoreflect.Uint32Kind, protoreflect.Fixed32Kind:
		s.Format = "uint32"
	case protoreflect.Int32Kind, protoreflect.Sint32Kind, protoreflect.Sfixed32Kind:
		s.Format = "int32"
	case protoreflect.Uint64Kind, protoreflect.Fixed64Kind:
		s.Format = "uint64"
	case protoreflect.Int64Kind, protoreflect.Sint64Kind, protoreflect.Sfixed64Kind:
		s.Format = "int64"
	}
}
