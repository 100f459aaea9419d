package main

import (
	"slices"
	"testing"

	"github.com/getkin/kin-openapi/openapi3"
)

func TestWireSchema(t *testing.T) {
	str64 := func(format string) *openapi3.SchemaRef {
		return openapi3.NewSchemaRef("", &openapi3.Schema{Type: &openapi3.Types{openapi3.TypeString}, Format: format})
	}
	tests := []struct {
		name         string
		schema       *openapi3.Schema
		answer       bool
		wantType     string
		wantRequired []string
	}{
		{"uint64 string is a number", str64("uint64").Value, false, openapi3.TypeInteger, nil},
		{"int64 string is a number", str64("int64").Value, false, openapi3.TypeInteger, nil},
		{"other strings stay", str64("date-time").Value, false, openapi3.TypeString, nil},
		{"an answer's fields are all present", &openapi3.Schema{
			Type:       &openapi3.Types{openapi3.TypeObject},
			Properties: openapi3.Schemas{"b": str64("uint64"), "a": str64("")},
		}, true, openapi3.TypeObject, []string{"a", "b"}},
		{"a request's fields are not", &openapi3.Schema{
			Type:       &openapi3.Types{openapi3.TypeObject},
			Properties: openapi3.Schemas{"a": str64("")},
		}, false, openapi3.TypeObject, nil},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			wireSchema(openapi3.NewSchemaRef("", tc.schema), tc.answer)
			if !tc.schema.Type.Is(tc.wantType) {
				t.Errorf("type %v, want %s", tc.schema.Type, tc.wantType)
			}
			if !slices.Equal(tc.schema.Required, tc.wantRequired) {
				t.Errorf("required %v, want %v", tc.schema.Required, tc.wantRequired)
			}
			if p := tc.schema.Properties["b"]; p != nil && !p.Value.Type.Is(openapi3.TypeInteger) {
				t.Errorf("nested uint64 property stayed %v", p.Value.Type)
			}
		})
	}
}

func TestHeadOf(t *testing.T) {
	get := &openapi3.Operation{OperationID: "GetUsage", Responses: openapi3.NewResponses(
		openapi3.WithStatus(200, &openapi3.ResponseRef{Value: openapi3.NewResponse().WithDescription("ok").WithJSONSchema(openapi3.NewObjectSchema())}),
	)}
	get.Responses.Set("default", &openapi3.ResponseRef{Ref: "#/components/responses/Error"})
	head := headOf(get)
	if head.OperationID != "HeadUsage" {
		t.Errorf("operationId %s", head.OperationID)
	}
	r := head.Responses.Status(200)
	if r == nil || r.Value == nil || len(r.Value.Content) != 0 {
		t.Fatalf("HEAD 200 %+v: want the answer without a body", r)
	}
	if head.Responses.Default() != nil {
		t.Error("HEAD kept the GET's error body; the generator adds a bodiless one")
	}
}
